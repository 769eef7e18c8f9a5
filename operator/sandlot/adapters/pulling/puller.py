"""Pull an image into containerd from a registry: through the daemon's Transfer
service where it has one (``transfer.py``), else client-side, as containerd 1.6's
own client does (1.6 has no Transfer service).

Resolve the reference (``adapters.pulling.registry``), pick this platform's manifest from
an index, stream the config and layer blobs into the Content service (``Write``,
digest and size checked by us while streaming and by containerd on commit), unpack
the layers for the snapshotter (``Snapshots.Prepare`` on the parent chain ID,
``Diff.Apply`` of the layer, ``Snapshots.Commit`` as the layer's chain ID), and
create or move the image record with the collector's last-used label. The create
path then finds the image exactly as if ``ctr images pull`` had put it there.

Everything happens under one containerd lease that expires by itself, so content
of a pull that dies half-way is collected by containerd's GC, and nothing is
collected before the image record holds it. The blobs carry containerd's GC
reference labels (``containerd.io/gc.ref.*``) so that, once the lease is gone, the
image keeps its manifest, config, layers and unpacked snapshots alive.

Bounds: one per-pull deadline spent across every call and chunk; a registry read
that gets no byte within the stall timeout fails at once (see the registry client).

``pull_method`` chooses (the agent asks for the Transfer service only with its
``image_pull_by_daemon`` setting: the daemon follows redirects and reaches addresses
outside ``policy.pulling.access``): the Transfer service when the daemon offers it (asked
once per puller) and the pull needs none of the agent's own registry-host
settings (mirrors, private CAs, skip-verify from the agent's ``hosts.toml``
directory, which containerd would read from its own filesystem instead); else
this client-side path, which every supported daemon serves (2.x included).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

import grpc
from google.protobuf import field_mask_pb2

from sandlot.adapters.containerd.containers import chain_id, manifest_gc_labels, snapshot_gc_labels
from sandlot.adapters.containerd.gen.services.images.v1 import images_pb2
from sandlot.adapters.containerd.gen.services.leases.v1 import leases_pb2
from sandlot.adapters.containerd.images import INDEX_MEDIA_TYPES, host_architecture
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling.hosts import endpoints_for
from sandlot.adapters.pulling.registry import Credential, Endpoint, RegistryClient, RegistryError
from sandlot.adapters.pulling.steps import Counter, Progress, PullSteps, descriptor
from sandlot.adapters.pulling.transfer import TransferNotOffered, TransferPull
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout
from sandlot.api.timestamps import rfc3339
from sandlot.policy.imagecaps import MAX_CONFIG_BYTES, mib
from sandlot.policy.pulling import FailureKind, ImageReference

log = logging.getLogger(__name__)

PULL_LEASE_TTL = timedelta(hours=1)

T = TypeVar("T")


class PullMethod(StrEnum):
    CLIENT_SIDE = "client-side"
    TRANSFER = "transfer"


def pull_method(*, transfer_offered: bool, agent_hosts: bool) -> PullMethod:
    """Which path pulls: the Transfer service when the daemon offers it (containerd
    2.x) and the pull goes to the registry itself with no setting of the agent's
    ``hosts.toml`` directory (``agent_hosts``: a mirror, a private CA, skip-verify,
    which the daemon would not see); else the client-side path through the content,
    snapshot and diff services, which every supported daemon serves."""
    if transfer_offered and not agent_hosts:
        return PullMethod.TRANSFER
    return PullMethod.CLIENT_SIDE


@dataclass(frozen=True)
class PullResult:
    name: str
    digest: str
    """The record's target: the index or manifest the reference resolved to."""
    total_bytes: int
    """Bytes of the config and layers of this platform."""
    fetched_bytes: int
    """Of those, the bytes that came over the network (the rest were on the node)."""
    seconds: float


class ContainerdPuller(PullSteps):
    """Pulls into one containerd namespace; one gRPC channel, shared by its pulls."""

    def __init__(
        self, address: str, namespace: str, *, transfer: bool = True, **options: Any
    ) -> None:
        """``transfer=False`` keeps every pull client-side, whatever the daemon offers."""
        super().__init__(address, namespace, **options)
        self._transfer = TransferPull(
            self._channel,
            namespace,
            snapshotter=self.snapshotter,
            stall_timeout=self.stall_timeout,
        )
        self._use_transfer = transfer
        self._offered: bool | None = None

    # ------------------------------------------------------------ the pull

    def transfer_offered(self, budget: Deadline) -> bool:
        """Whether the daemon serves the Transfer service, asked once."""
        if not self._use_transfer:
            return False
        if self._offered is None:
            self._offered = self._transfer.offered(budget.remaining("Transfer probe"))
            log.info(
                "containerd %s the Transfer service",
                "offers" if self._offered else "does not offer",
            )
        return self._offered

    def method(
        self, ref: ImageReference, endpoints: list[Endpoint], budget: Deadline
    ) -> PullMethod:
        """How this pull is done (see ``pull_method``)."""
        return pull_method(
            transfer_offered=self.transfer_offered(budget),
            agent_hosts=endpoints != endpoints_for(ref, None),
        )

    def pull(
        self,
        name: str,
        ref: ImageReference,
        endpoints: list[Endpoint],
        credential: Credential | None,
        *,
        deadline: float,
        labels: Mapping[str, str],
        progress: Progress | None = None,
    ) -> PullResult:
        """Pull ``ref`` into the record ``name``; the first endpoint that serves it wins
        (mirrors first, the registry itself last)."""
        budget = Deadline(deadline, what=f"pull {name}", expired=RuntimeTimeout)
        started = time.monotonic()
        if self.method(ref, endpoints, budget) is PullMethod.TRANSFER:
            try:
                return self._pull_by_transfer(
                    name, ref, endpoints[0], credential, budget, labels, progress
                )
            except TransferNotOffered as exc:
                log.info("%s; asking the daemon again, pulling client-side now", exc)
                self._offered = None
        return self._on_endpoints(
            ref,
            endpoints,
            credential,
            budget,
            lambda client: self._pull_from(client, name, ref, budget, labels, progress, started),
            f"pull {name}",
        )

    def verify(
        self,
        ref: ImageReference,
        endpoints: list[Endpoint],
        credential: Credential | None,
        *,
        deadline: float,
    ) -> None:
        """Return when ``credential`` (None: anonymous) may pull ``ref``: one manifest
        HEAD, on the first endpoint that answers; else raise ``RegistryError``."""
        budget = Deadline(deadline, what=f"verify {ref.name}", expired=RuntimeTimeout)
        self._on_endpoints(
            ref,
            endpoints,
            credential,
            budget,
            lambda client: client.manifest_exists(ref.reference),
            f"verify {ref.name}",
        )

    def _on_endpoints(
        self,
        ref: ImageReference,
        endpoints: list[Endpoint],
        credential: Credential | None,
        budget: Deadline,
        action: Callable[[RegistryClient], T],
        what: str,
    ) -> T:
        """``action`` on the first endpoint that serves it (mirrors first, the registry
        itself last); the last endpoint's refusal if none does."""
        last: RegistryError | None = None
        for endpoint in endpoints:
            client = RegistryClient(
                endpoint,
                ref.repository,
                credential,
                connect_timeout=min(self.connect_timeout, budget.seconds),
                stall_timeout=self.stall_timeout,
                deadline=budget,
                access=self.access,
            )
            try:
                return action(client)
            except RegistryError as exc:
                last = exc
            finally:
                client.close()
        raise last or RegistryError(f"{what}: no endpoint to ask")

    def _pull_by_transfer(
        self,
        name: str,
        ref: ImageReference,
        endpoint: Endpoint,
        credential: Credential | None,
        budget: Deadline,
        labels: Mapping[str, str],
        progress: Progress | None,
    ) -> PullResult:
        started = time.monotonic()
        # containerd's resolver wants a tag or a digest: an unqualified name means latest.
        reference = ref.name if ref.tag or ref.digest else f"{ref.name}:latest"
        scheme = endpoint.url.split("://", 1)[0]
        total, fetched = self._transfer.pull(
            name, reference, scheme, credential, budget, labels, progress
        )
        image = self._call(
            self._images.Get, images_pb2.GetImageRequest(name=name), budget, f"Images.Get {name}"
        ).image
        return PullResult(
            name, str(image.target.digest), total, fetched, time.monotonic() - started
        )

    def _pull_from(
        self,
        client: RegistryClient,
        name: str,
        ref: ImageReference,
        budget: Deadline,
        labels: Mapping[str, str],
        progress: Progress | None,
        started: float,
    ) -> PullResult:
        top_bytes, top_type = client.manifest(ref.reference)
        top_digest = "sha256:" + hashlib.sha256(top_bytes).hexdigest()
        if ref.digest and ref.digest != top_digest:
            raise RegistryError(f"{ref.name}: the registry sent {top_digest}")
        top = json.loads(top_bytes)
        top_type = top.get("mediaType") or top_type
        index_bytes, manifest_bytes, manifest_desc = None, top_bytes, None
        if top_type in INDEX_MEDIA_TYPES or "manifests" in top:
            manifest_desc = self._platform_entry(ref, top)
            index_bytes = top_bytes
            manifest_bytes = self._small_blob(client, manifest_desc, manifest=True)
        manifest = json.loads(manifest_bytes)
        config_desc, layers = manifest["config"], list(manifest.get("layers") or [])
        counter = Counter(int(config_desc["size"]) + sum(int(x["size"]) for x in layers), progress)
        lease = self._create_lease(budget)
        caps = self.image_budget(name)
        try:
            config_bytes = self._small_blob(client, config_desc)
            counter.add(len(config_bytes), fetched=True)
            diff_ids = list((json.loads(config_bytes).get("rootfs") or {}).get("diff_ids") or [])
            if len(diff_ids) != len(layers):
                raise RegistryError(
                    f"{ref.name}: config lists {len(diff_ids)} layers, manifest {len(layers)}"
                )
            for layer, diff_id in zip(layers, diff_ids, strict=True):
                uncompressed = {"containerd.io/uncompressed": diff_id}
                self._ensure_blob(client, layer, uncompressed, budget, lease, counter, caps)
            self._unpack(layers, diff_ids, budget, lease, caps)
            gc_snapshot = snapshot_gc_labels(self.snapshotter, chain_id(diff_ids))
            self._write(config_desc, [config_bytes], gc_snapshot, budget, lease)
            layer_digests = [layer["digest"] for layer in layers]
            manifest_labels = manifest_gc_labels(config_desc["digest"], layer_digests)
            manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
            manifest_size = len(manifest_bytes)
            this = {
                "digest": manifest_digest,
                "size": manifest_size,
                "mediaType": manifest.get("mediaType") or top_type,
            }
            self._write(this, [manifest_bytes], manifest_labels, budget, lease)
            target = this
            if index_bytes is not None and manifest_desc is not None:
                target = {"digest": top_digest, "size": len(index_bytes), "mediaType": top_type}
                self._write(
                    target,
                    [index_bytes],
                    {"containerd.io/gc.ref.content.m.0": manifest_desc["digest"]},
                    budget,
                    lease,
                )
            self._put_image(name, target, labels, budget)
        finally:
            self._delete_lease(lease)
        return PullResult(
            name, str(target["digest"]), counter.total, counter.fetched, time.monotonic() - started
        )

    def _platform_entry(self, ref: ImageReference, index: Mapping[str, Any]) -> dict[str, Any]:
        arch = host_architecture()
        for entry in index.get("manifests") or []:
            plat = entry.get("platform") or {}
            if plat.get("os") == "linux" and plat.get("architecture") == arch:
                return dict(entry)
        raise RegistryError(
            f"{ref.name}: no linux/{arch} manifest in its index", FailureKind.NOT_FOUND
        )

    def _small_blob(
        self, client: RegistryClient, desc: Mapping[str, Any], *, manifest: bool = False
    ) -> bytes:
        """A manifest (capped at ``MAX_MANIFEST_BYTES``) or a config, read no further
        than its descriptor's size and ``MAX_CONFIG_BYTES``."""
        digest = str(desc["digest"])
        if manifest:
            data = client.manifest(digest)[0]
        else:
            size = int(desc.get("size") or 0)
            if size > MAX_CONFIG_BYTES:
                raise RegistryError(
                    f"config {digest}: {size} bytes, more than {mib(MAX_CONFIG_BYTES)}, the cap",
                    FailureKind.TOO_LARGE,
                )
            data = b"".join(client.blob(digest, limit=size or MAX_CONFIG_BYTES))
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise RegistryError(f"blob {digest}: the registry sent content of digest {got}")
        return data

    # ------------------------------------------------------------ image record and lease

    def _put_image(
        self, name: str, target: Mapping[str, Any], labels: Mapping[str, str], budget: Deadline
    ) -> None:
        image = images_pb2.Image(name=name, target=descriptor(target), labels=dict(labels))
        try:
            self._call(
                self._images.Create,
                images_pb2.CreateImageRequest(image=image),
                budget,
                f"Images.Create {name}",
            )
        except RuntimeError_ as exc:
            if exc.code != "already_exists":
                raise
            paths = ["target", *(f"labels.{k}" for k in labels)]
            self._call(
                self._images.Update,
                images_pb2.UpdateImageRequest(
                    image=image, update_mask=field_mask_pb2.FieldMask(paths=paths)
                ),
                budget,
                f"Images.Update {name}",
            )

    def _create_lease(self, budget: Deadline) -> str:
        lease = f"sandlot-pull-{uuid.uuid4().hex[:12]}"
        expires = datetime.now(UTC) + PULL_LEASE_TTL
        self._call(
            self._leases.Create,
            leases_pb2.CreateRequest(
                id=lease, labels={"containerd.io/gc.expire": rfc3339(expires, "seconds")}
            ),
            budget,
            f"Leases.Create {lease}",
        )
        return lease

    def _delete_lease(self, lease: str) -> None:
        # Best effort: an expired lease is collected by containerd anyway.
        with contextlib.suppress(grpc.RpcError):
            self._leases.Delete(
                leases_pb2.DeleteRequest(id=lease), timeout=10, metadata=self._metadata
            )


__all__ = [
    "ContainerdPuller",
    "PullMethod",
    "PullResult",
    "pull_method",
]
