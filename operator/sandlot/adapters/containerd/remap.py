"""The root filesystem of a user-namespaced sandbox: the image's layers with every
owner shifted into the sandbox's host ID range.

runc 1.1 cannot idmap a mount, so the files themselves must belong to the range.
containerd 1.6's Go client does that with a remapped snapshot (it mounts a copy of
the image and chowns every file). Here the shift happens on the layer stream, and
containerd does every mount: each layer is read from the content store, its tar
headers' UIDs and GIDs moved up by the range's first ID, written back as an
uncompressed layer (under the create's lease, deleted once applied) and applied
by the Diff service into the container's own snapshot, which has no parent. The
agent needs no access to containerd's directories and no privilege beyond its
socket.

Entries go under ``ROOT_DIR`` inside the snapshot, a directory owned by the
range's root, which the OCI spec's ``root.path`` names: the applier never changes
the owner of a snapshot's own top directory, and a ``/`` owned by the node's root
would be ``nobody`` inside.

The cost: each such sandbox's root filesystem is a full copy of its image, made
when its container is created (time and disk in proportion to the image), and
removed with its container's snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import tarfile
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

import grpc

from sandlot.adapters.containerd.connection import Connection, translate
from sandlot.adapters.containerd.gen.services.content.v1 import content_pb2
from sandlot.adapters.containerd.gen.services.diff.v1 import diff_pb2
from sandlot.adapters.containerd.gen.services.snapshots.v1 import snapshots_pb2
from sandlot.adapters.containerd.gen.types import descriptor_pb2
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import RuntimeError_

ROOT_DIR = "userns-root"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 1 << 20
SPOOL = 32 << 20
_OWNER_HEADERS = ("uid", "gid", "uname", "gname", "path", "linkpath")


def _under_root(name: str) -> str:
    clean = name.lstrip("/")
    while clean.startswith("./"):
        clean = clean[2:]
    clean = clean.rstrip("/")
    return ROOT_DIR if clean in ("", ".") else f"{ROOT_DIR}/{clean}"


def shift_layer(src: IO[bytes], dst: IO[bytes], first_id: int, *, add_root: bool) -> None:
    """Copy the layer tar ``src`` (plain or gzip) to ``dst``: every entry under
    ``ROOT_DIR``, its owner moved up by ``first_id``; with ``add_root``, the
    ``ROOT_DIR`` entry itself (owned by the range's root) first."""
    with (
        tarfile.open(fileobj=src, mode="r|*") as layer,
        tarfile.open(fileobj=dst, mode="w|", format=tarfile.PAX_FORMAT) as out,
    ):
        if add_root:
            root = tarfile.TarInfo(ROOT_DIR)
            root.type, root.mode, root.uid, root.gid = tarfile.DIRTYPE, 0o755, first_id, first_id
            out.addfile(root)
        for entry in layer:
            entry.name = _under_root(entry.name)
            if entry.islnk():
                entry.linkname = _under_root(entry.linkname)
            entry.uid += first_id
            entry.gid += first_id
            entry.uname = entry.gname = ""
            entry.pax_headers = {
                k: v for k, v in entry.pax_headers.items() if k not in _OWNER_HEADERS
            }
            data = layer.extractfile(entry) if entry.isreg() else None
            out.addfile(entry, data)


class Remapper:
    """Builds a container's shifted root filesystem as snapshot ``key``."""

    def __init__(self, conn: Connection, snapshotter: str) -> None:
        self._conn, self.snapshotter = conn, snapshotter

    def prepare(
        self,
        key: str,
        layers: Sequence[Mapping[str, Any]],
        first_id: int,
        budget: Deadline,
        lease: str,
    ) -> None:
        """Snapshot ``key`` holding ``layers``, shifted; removed again on failure."""
        what = f"Snapshots.Prepare {key} (user namespace)"
        mounts = self._conn.call(
            self._conn.snapshots.Prepare,
            snapshots_pb2.PrepareSnapshotRequest(snapshotter=self.snapshotter, key=key),
            timeout=budget,
            what=what,
            lease=lease,
        ).mounts
        try:
            for i, layer in enumerate(layers):
                self._apply(layer, mounts, first_id, budget, lease, add_root=i == 0)
        except BaseException:
            with contextlib.suppress(RuntimeError_):
                self._conn.call(
                    self._conn.snapshots.Remove,
                    snapshots_pb2.RemoveSnapshotRequest(snapshotter=self.snapshotter, key=key),
                    timeout=max(budget.remaining("Snapshots.Remove"), 1.0),
                    what=f"Snapshots.Remove {key}",
                )
            raise

    def _apply(
        self,
        layer: Mapping[str, Any],
        mounts: Any,
        first_id: int,
        budget: Deadline,
        lease: str,
        *,
        add_root: bool,
    ) -> None:
        digest = str(layer["digest"])
        with (
            tempfile.SpooledTemporaryFile(SPOOL) as original,
            tempfile.SpooledTemporaryFile(SPOOL) as shifted,
        ):
            self._read(digest, original, budget)
            original.seek(0)
            if str(layer.get("mediaType", "")).endswith("+zstd"):
                raise RuntimeError_(
                    f"layer {digest}: zstd layers cannot be shifted", code="invalid"
                )
            try:
                shift_layer(original, shifted, first_id, add_root=add_root)  # gzip or plain
            except tarfile.TarError as exc:
                raise RuntimeError_(
                    f"layer {digest} cannot be read: {exc}", code="invalid"
                ) from exc
            size = shifted.tell()
            shifted.seek(0)
            hasher = hashlib.sha256()
            for chunk in iter(lambda: shifted.read(CHUNK), b""):
                hasher.update(chunk)
            shifted_digest = "sha256:" + hasher.hexdigest()
            shifted.seek(0)
            self._write(shifted_digest, size, shifted, budget, lease)
            try:
                self._conn.call(
                    self._conn.diff.Apply,
                    diff_pb2.ApplyRequest(
                        diff=descriptor_pb2.Descriptor(
                            media_type=MEDIA_LAYER, digest=shifted_digest, size=size
                        ),
                        mounts=mounts,
                    ),
                    timeout=budget,
                    what=f"Diff.Apply {shifted_digest} (layer {digest} shifted by {first_id})",
                    lease=lease,
                )
            finally:
                with contextlib.suppress(RuntimeError_):
                    self._conn.call(
                        self._conn.content.Delete,
                        content_pb2.DeleteContentRequest(digest=shifted_digest),
                        timeout=max(budget.remaining("Content.Delete"), 1.0),
                        what=f"Content.Delete {shifted_digest}",
                    )

    def _read(self, digest: str, into: IO[bytes], budget: Deadline) -> None:
        what = f"Content.Read {digest}"
        timeout = budget.remaining(what)
        try:
            for response in self._conn.content.Read(
                content_pb2.ReadContentRequest(digest=digest),
                timeout=timeout,
                metadata=self._conn.metadata,
            ):
                into.write(response.data)
        except grpc.RpcError as exc:
            raise translate(exc, what, timeout) from exc

    def _write(self, digest: str, size: int, data: IO[bytes], budget: Deadline, lease: str) -> None:
        ref = f"sandlot-userns-{uuid.uuid4().hex[:12]}"

        def requests() -> Iterator[Any]:
            yield content_pb2.WriteContentRequest(
                action=content_pb2.STAT, ref=ref, total=size, expected=digest
            )
            offset = 0
            for chunk in iter(lambda: data.read(CHUNK), b""):
                yield content_pb2.WriteContentRequest(
                    action=content_pb2.WRITE, ref=ref, offset=offset, data=chunk
                )
                offset += len(chunk)
            yield content_pb2.WriteContentRequest(
                action=content_pb2.COMMIT, ref=ref, total=size, offset=offset, expected=digest
            )

        # A layer shifted the same way before is already there, and as good.
        self._conn.write_blob(requests(), digest, lease, budget)


__all__ = ["ROOT_DIR", "Remapper", "shift_layer"]
