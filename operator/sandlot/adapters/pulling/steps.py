"""The steps of a client-side pull that talk to containerd: content and snapshots.

``pull.ContainerdPuller`` drives them; they are apart so each module stays one
thing. Content is written through the Content service's ``Write`` stream (digest
and size checked by us while streaming, and by containerd on commit); a layer is
unpacked by preparing a snapshot on its parent's chain ID, applying the layer
with the Diff service, and committing it as its own chain ID.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc
from google.protobuf import field_mask_pb2

from sandlot.adapters.containerd.connection import (
    LEASE_HEADER,
    NAMESPACE_HEADER,
    grpc_target,
    translate,
)
from sandlot.adapters.containerd.containers import DEFAULT_SNAPSHOTTER, chain_id
from sandlot.adapters.containerd.gen.services.content.v1 import content_pb2, content_pb2_grpc
from sandlot.adapters.containerd.gen.services.diff.v1 import diff_pb2, diff_pb2_grpc
from sandlot.adapters.containerd.gen.services.images.v1 import images_pb2, images_pb2_grpc
from sandlot.adapters.containerd.gen.services.leases.v1 import leases_pb2_grpc
from sandlot.adapters.containerd.gen.services.snapshots.v1 import (
    snapshots_pb2,
    snapshots_pb2_grpc,
)
from sandlot.adapters.containerd.gen.types import descriptor_pb2
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling.registry import RegistryClient, RegistryError
from sandlot.adapters.pulling.unpacked import ImageBudget
from sandlot.adapters.runtime import NotFound, RuntimeError_, RuntimeTimeout
from sandlot.policy.imagecaps import MAX_UNPACKED_IMAGE_BYTES, MAX_UNPACKED_LAYER_BYTES
from sandlot.policy.pulling import RegistryAccess

Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``, called as bytes arrive."""


def descriptor(d: Mapping[str, Any]) -> descriptor_pb2.Descriptor:
    return descriptor_pb2.Descriptor(
        media_type=str(d.get("mediaType", "")), digest=str(d["digest"]), size=int(d["size"])
    )


class Counter:
    """Bytes of one pull: done (fetched or already on the node) and fetched."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.fetched = total, 0, 0
        self._progress = progress

    def add(self, n: int, *, fetched: bool) -> None:
        self.done += n
        if fetched:
            self.fetched += n
        if self._progress is not None:
            self._progress(self.done, self.total)


class PullSteps:
    """containerd calls of one namespace's pulls, on one gRPC channel."""

    def __init__(
        self,
        address: str,
        namespace: str,
        *,
        snapshotter: str = DEFAULT_SNAPSHOTTER,
        connect_timeout: float = 10.0,
        stall_timeout: float = 30.0,
        access: RegistryAccess | None = None,
        max_unpacked_layer: int = MAX_UNPACKED_LAYER_BYTES,
        max_unpacked: int = MAX_UNPACKED_IMAGE_BYTES,
    ) -> None:
        """``access``: where registry requests may go (default: no private address);
        ``max_unpacked_layer``, ``max_unpacked``: the caps on the bytes one layer, and
        all the layers one pull unpacks, unpack to (``ImageBudget``)."""
        self.namespace = namespace
        self.max_unpacked_layer = max_unpacked_layer
        self.max_unpacked = max_unpacked
        self.access = access or RegistryAccess()
        self.snapshotter = snapshotter
        self.connect_timeout = connect_timeout
        self.stall_timeout = stall_timeout
        self._channel = grpc.insecure_channel(grpc_target(address))
        self._metadata: tuple[tuple[str, str], ...] = ((NAMESPACE_HEADER, namespace),)
        self._content = content_pb2_grpc.ContentStub(self._channel)
        self._images = images_pb2_grpc.ImagesStub(self._channel)
        self._snapshots = snapshots_pb2_grpc.SnapshotsStub(self._channel)
        self._diff = diff_pb2_grpc.DiffStub(self._channel)
        self._leases = leases_pb2_grpc.LeasesStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    # ------------------------------------------------------------ plumbing

    def _call(self, method: Any, request: Any, budget: Deadline, what: str, lease: str = "") -> Any:
        timeout = budget.remaining(what)
        metadata = self._metadata + (((LEASE_HEADER, lease),) if lease else ())
        try:
            return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise translate(exc, what, timeout) from exc

    def has_image(self, name: str, *, timeout: float) -> bool:
        return self.image_labels(name, timeout=timeout) is not None

    def image_labels(self, name: str, *, timeout: float) -> dict[str, str] | None:
        """The labels of the image record ``name``; None when there is none."""
        budget = Deadline(timeout, expired=RuntimeTimeout)
        try:
            got = self._call(self._images.Get, images_pb2.GetImageRequest(name=name), budget, name)
        except NotFound:
            return None
        return dict(got.image.labels)

    # ------------------------------------------------------------ content

    def _info(self, digest: str, budget: Deadline) -> Any | None:
        try:
            return self._call(
                self._content.Info,
                content_pb2.InfoRequest(digest=digest),
                budget,
                f"Content.Info {digest}",
            ).info
        except NotFound:
            return None

    def image_budget(self, what: str) -> ImageBudget:
        """The unpacked-bytes caps of one pull."""
        return ImageBudget(what, layer_cap=self.max_unpacked_layer, image_cap=self.max_unpacked)

    def _ensure_blob(
        self,
        client: RegistryClient,
        desc: Mapping[str, Any],
        labels: Mapping[str, str],
        budget: Deadline,
        lease: str,
        counter: Counter,
        caps: ImageBudget,
    ) -> None:
        """The layer blob ``desc`` in the content store: fetched, and its unpacked
        bytes counted against ``caps`` as it arrives, when it is not there yet."""
        digest = str(desc["digest"])
        if self._info(digest, budget) is not None:
            self._label(digest, labels, budget)
            counter.add(int(desc["size"]), fetched=False)
            return
        meter = caps.meter(digest)

        def counted() -> Iterator[bytes]:
            # Never more than the manifest says: the content store holds no surprise.
            for chunk in client.blob(digest, limit=int(desc["size"])):
                counter.add(len(chunk), fetched=True)
                meter.feed(chunk)
                yield chunk
            meter.finish()  # past a cap: raised before the blob is committed

        self._write(desc, counted(), labels, budget, lease)

    def _label(self, digest: str, labels: Mapping[str, str], budget: Deadline) -> None:
        self._call(
            self._content.Update,
            content_pb2.UpdateRequest(
                info=content_pb2.Info(digest=digest, labels=dict(labels)),
                update_mask=field_mask_pb2.FieldMask(paths=[f"labels.{k}" for k in labels]),
            ),
            budget,
            f"Content.Update labels of {digest}",
        )

    def _write(
        self,
        desc: Mapping[str, Any],
        chunks: Iterable[bytes],
        labels: Mapping[str, str],
        budget: Deadline,
        lease: str,
    ) -> None:
        """Stream ``chunks`` into the content store as ``desc``; digest and size checked."""
        digest, size = str(desc["digest"]), int(desc["size"])
        if self._info(digest, budget) is not None:
            self._label(digest, labels, budget)
            return
        ref = f"sandlot-pull-{digest}-{uuid.uuid4().hex[:8]}"
        failure: list[BaseException] = []

        def requests() -> Iterator[Any]:
            yield content_pb2.WriteContentRequest(
                action=content_pb2.STAT, ref=ref, total=size, expected=digest
            )
            hasher, offset = hashlib.sha256(), 0
            try:
                for chunk in chunks:
                    hasher.update(chunk)
                    yield content_pb2.WriteContentRequest(
                        action=content_pb2.WRITE, ref=ref, offset=offset, data=chunk
                    )
                    offset += len(chunk)
                    budget.remaining(f"write {digest}")
            except BaseException as exc:  # surfaces below, after the stream is closed
                failure.append(exc)
                return
            got = "sha256:" + hasher.hexdigest()
            if got != digest or offset != size:
                failure.append(
                    RegistryError(f"blob {digest}: got {offset} bytes of digest {got}, want {size}")
                )
                return
            yield content_pb2.WriteContentRequest(
                action=content_pb2.COMMIT,
                ref=ref,
                total=size,
                offset=offset,
                expected=digest,
                labels=dict(labels),
            )

        what = f"Content.Write {digest}"
        timeout = budget.remaining(what)
        try:
            for _ in self._content.Write(
                requests(), timeout=timeout, metadata=(*self._metadata, (LEASE_HEADER, lease))
            ):
                pass
        except grpc.RpcError as exc:
            if failure:
                raise failure[0] from None
            error = translate(exc, what, timeout)
            if isinstance(error, RuntimeTimeout):
                raise RuntimeTimeout(
                    f"{budget.what}: {what}: deadline of {budget.seconds:g}s passed"
                ) from exc
            if error.code != "already_exists":  # a concurrent pull committed it first
                raise error from exc
            self._label(digest, labels, budget)
        if failure:
            with contextlib.suppress(grpc.RpcError):
                self._content.Abort(
                    content_pb2.AbortRequest(ref=ref), timeout=5, metadata=self._metadata
                )
            raise failure[0]

    # ------------------------------------------------------------ snapshots

    def _unpack(
        self,
        layers: list[Mapping[str, Any]],
        diff_ids: list[str],
        budget: Deadline,
        lease: str,
        caps: ImageBudget,
    ) -> None:
        """Apply each layer whose snapshot is missing; one not counted against
        ``caps`` while fetched (its blob was on the node) is counted from the
        content store first, so nothing is applied past a cap."""
        parent = ""
        for i, layer in enumerate(layers):
            chain = chain_id(diff_ids[: i + 1])
            if not self._snapshot_exists(chain, budget):
                if str(layer["digest"]) not in caps.counted:
                    self._meter_stored(str(layer["digest"]), caps, budget)
                self._apply_layer(layer, diff_ids[i], chain, parent, budget, lease)
            parent = chain

    def _meter_stored(self, digest: str, caps: ImageBudget, budget: Deadline) -> None:
        meter = caps.meter(digest)
        what = f"Content.Read {digest}"
        timeout = budget.remaining(what)
        call = self._content.Read(
            content_pb2.ReadContentRequest(digest=digest), timeout=timeout, metadata=self._metadata
        )
        try:
            for response in call:
                meter.feed(response.data)
            meter.finish()
        except grpc.RpcError as exc:
            raise translate(exc, what, timeout) from exc
        finally:
            call.cancel()

    def _snapshot_exists(self, key: str, budget: Deadline) -> bool:
        try:
            self._call(
                self._snapshots.Stat,
                snapshots_pb2.StatSnapshotRequest(snapshotter=self.snapshotter, key=key),
                budget,
                f"Snapshots.Stat {key}",
            )
        except NotFound:
            return False
        return True

    def _apply_layer(
        self,
        layer: Mapping[str, Any],
        diff_id: str,
        chain: str,
        parent: str,
        budget: Deadline,
        lease: str,
    ) -> None:
        key = f"extract-{uuid.uuid4().hex[:12]} {chain}"
        mounts = self._call(
            self._snapshots.Prepare,
            snapshots_pb2.PrepareSnapshotRequest(
                snapshotter=self.snapshotter, key=key, parent=parent
            ),
            budget,
            f"Snapshots.Prepare {key}",
            lease,
        ).mounts
        try:
            applied = self._call(
                self._diff.Apply,
                diff_pb2.ApplyRequest(diff=descriptor(layer), mounts=mounts),
                budget,
                f"Diff.Apply {layer['digest']}",
                lease,
            ).applied
            if applied.digest != diff_id:
                raise RegistryError(
                    f"layer {layer['digest']} unpacks to {applied.digest}, config says {diff_id}"
                )
            try:
                self._call(
                    self._snapshots.Commit,
                    snapshots_pb2.CommitSnapshotRequest(
                        snapshotter=self.snapshotter, name=chain, key=key
                    ),
                    budget,
                    f"Snapshots.Commit {chain}",
                    lease,
                )
            except RuntimeError_ as exc:
                if exc.code != "already_exists":  # unpacked meanwhile by another pull
                    raise
                raise _Unprepared from None
        except _Unprepared:
            self._remove_quietly(key)
        except BaseException:
            self._remove_quietly(key)
            raise

    def _remove_quietly(self, key: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            self._snapshots.Remove(
                snapshots_pb2.RemoveSnapshotRequest(snapshotter=self.snapshotter, key=key),
                timeout=10,
                metadata=self._metadata,
            )


class _Unprepared(Exception):
    """The layer's snapshot exists already: drop the one prepared for it."""
