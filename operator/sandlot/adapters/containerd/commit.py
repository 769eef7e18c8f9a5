"""Committing a container's writable filesystem to an image in the node's store.

What ``nerdctl commit`` does, over containerd's services: the Diff service
compares a read-only view of the container's parent (its image's layers) with the
container's own snapshot and writes the difference to the content store as one
uncompressed layer (so its digest is its diff ID). The layer is unpacked at once
(a snapshot prepared on the parent, the layer applied, committed under the new
chain ID), so a container is created from the new image as from any unpacked
one. A new config (the layer's diff ID appended) and manifest (the layer
appended) are written with containerd's GC labels, manifest -> config and
layers, config -> the committed snapshot, and an image record named by the
caller holds them all. Everything is made under one lease until the record
exists, so a collection in between cannot take half of it.

A container whose snapshot does not sit on its image's chain (a user namespace's
shifted copy) cannot be committed this way: refused with code ``unsupported``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import field_mask_pb2

from sandlot.adapters.containerd.connection import Connection
from sandlot.adapters.containerd.containers import chain_id, manifest_gc_labels, snapshot_gc_labels
from sandlot.adapters.containerd.gen.services.content.v1 import content_pb2
from sandlot.adapters.containerd.gen.services.diff.v1 import diff_pb2
from sandlot.adapters.containerd.gen.services.images.v1 import images_pb2
from sandlot.adapters.containerd.gen.services.snapshots.v1 import snapshots_pb2
from sandlot.adapters.containerd.gen.types import descriptor_pb2
from sandlot.adapters.containerd.images import Images
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import UNSUPPORTED, RuntimeError_, RuntimeTimeout

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
COMMIT_LEASE_TTL = timedelta(hours=1)
CHUNK = 1 << 20


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def committed_documents(
    config: Mapping[str, Any],
    layers: list[dict[str, Any]],
    layer: Mapping[str, Any],
    created: datetime,
) -> tuple[bytes, bytes]:
    """The new config and manifest (as bytes) for an image that is ``config`` over
    ``layers`` plus ``layer`` (a descriptor of an uncompressed tar: digest = diff ID)."""
    new_config = json.loads(json.dumps(dict(config)))
    rootfs = new_config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
    rootfs.setdefault("diff_ids", []).append(layer["digest"])
    stamp = created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new_config.setdefault("history", []).append(
        {"created": stamp, "created_by": "sandlot suspend", "comment": "writable layer"}
    )
    new_config["created"] = stamp
    config_bytes = json.dumps(new_config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {
            "mediaType": MEDIA_CONFIG,
            "digest": _digest(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [*layers, dict(layer)],
    }
    return config_bytes, json.dumps(manifest, sort_keys=True).encode()


class Committer:
    """Commits containers of one snapshotter to images, on one ``Connection``."""

    def __init__(self, conn: Connection, images: Images, snapshotter: str) -> None:
        self._conn, self._images, self.snapshotter = conn, images, snapshotter

    def commit(
        self, container_id: str, name: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        """Image ``name`` holding ``container_id``'s filesystem as it is now; its
        manifest's digest. ``labels`` go on the image record."""
        budget = Deadline(timeout, expired=RuntimeTimeout)
        container = self._conn.get_container(container_id, timeout=budget)
        manifest = self._images.manifest(container.image, budget)
        config = self._images.config_json(container.image, budget)
        diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
        if not diff_ids:
            raise RuntimeError_(f"image {container.image}: config lists no layers", "invalid")
        parent = chain_id(diff_ids)
        self._check_parent(container.snapshot_key, parent, budget)
        lease = self._conn.create_lease(
            f"sandlot-commit-{container_id}-{uuid.uuid4().hex[:8]}", COMMIT_LEASE_TTL, budget
        )
        try:
            layer = self._diff(container.snapshot_key, parent, budget, lease)
            new_chain = chain_id([*diff_ids, layer["digest"]])
            self._unpack(layer, parent, new_chain, budget, lease)
            config_bytes, manifest_bytes = committed_documents(
                config, list(manifest.get("layers") or []), layer, datetime.now(UTC)
            )
            config_digest = _digest(config_bytes)
            gc_snapshot = snapshot_gc_labels(self.snapshotter, new_chain)
            self._write(config_digest, config_bytes, gc_snapshot, budget, lease)
            layers = [*(manifest.get("layers") or []), layer]
            refs = manifest_gc_labels(config_digest, [str(entry["digest"]) for entry in layers])
            manifest_digest = _digest(manifest_bytes)
            self._write(manifest_digest, manifest_bytes, refs, budget, lease)
            target = descriptor_pb2.Descriptor(
                media_type=MEDIA_MANIFEST, digest=manifest_digest, size=len(manifest_bytes)
            )
            self._put_image(name, target, labels, budget)
        finally:
            self._conn.delete_lease_quietly(lease, budget)
        return manifest_digest

    def copy(self, source: str, name: str, labels: Mapping[str, str], *, timeout: float) -> str:
        """Image ``name`` pointing at what image ``source`` points at (its content and
        snapshots then held by both records); the manifest's digest."""
        budget = Deadline(timeout, expired=RuntimeTimeout)
        target = self._images.target(source, budget)
        self._put_image(name, target, labels, budget)
        return str(target.digest)

    def _check_parent(self, key: str, parent: str, budget: Deadline) -> None:
        info = self._conn.call(
            self._conn.snapshots.Stat,
            snapshots_pb2.StatSnapshotRequest(snapshotter=self.snapshotter, key=key),
            timeout=budget,
            what=f"Snapshots.Stat {key}",
        ).info
        if info.parent != parent:
            raise RuntimeError_(
                f"snapshot {key} does not sit on its image's layers (a user namespace's "
                "copy): its filesystem cannot be committed",
                code=UNSUPPORTED,
            )

    def _snapshot(self, key: str, parent: str, budget: Deadline, lease: str, *, view: bool) -> Any:
        """Mounts of a new snapshot on ``parent``: a read-only view, or a prepared one."""
        kind = "View" if view else "Prepare"
        what = f"Snapshots.{kind} {key}"
        if view:
            method: Any = self._conn.snapshots.View
            request: Any = snapshots_pb2.ViewSnapshotRequest(
                snapshotter=self.snapshotter, key=key, parent=parent
            )
        else:
            method = self._conn.snapshots.Prepare
            request = snapshots_pb2.PrepareSnapshotRequest(
                snapshotter=self.snapshotter, key=key, parent=parent
            )
        return self._conn.call(method, request, timeout=budget, what=what, lease=lease).mounts

    def _mounts(self, key: str, budget: Deadline) -> Any:
        return self._conn.call(
            self._conn.snapshots.Mounts,
            snapshots_pb2.MountsRequest(snapshotter=self.snapshotter, key=key),
            timeout=budget,
            what=f"Snapshots.Mounts {key}",
        ).mounts

    def _remove(self, key: str, budget: Deadline) -> None:
        with contextlib.suppress(RuntimeError_):
            self._conn.call(
                self._conn.snapshots.Remove,
                snapshots_pb2.RemoveSnapshotRequest(snapshotter=self.snapshotter, key=key),
                timeout=max(budget.remaining(f"Snapshots.Remove {key}"), 1.0),
                what=f"Snapshots.Remove {key}",
            )

    def _diff(self, key: str, parent: str, budget: Deadline, lease: str) -> dict[str, Any]:
        """The layer of what ``key`` holds beyond ``parent``, in the content store."""
        view = f"sandlot-commit-view-{uuid.uuid4().hex[:12]}"
        left = self._snapshot(view, parent, budget, lease, view=True)
        try:
            right = self._mounts(key, budget)
            desc = self._conn.call(
                self._conn.diff.Diff,
                diff_pb2.DiffRequest(
                    left=left, right=right, media_type=MEDIA_LAYER, ref=f"sandlot-commit-{view}"
                ),
                timeout=budget,
                what=f"Diff.Diff {key}",
                lease=lease,
            ).diff
        finally:
            self._remove(view, budget)
        return {"mediaType": MEDIA_LAYER, "digest": desc.digest, "size": desc.size}

    def _unpack(
        self, layer: Mapping[str, Any], parent: str, name: str, budget: Deadline, lease: str
    ) -> None:
        """Snapshot ``name``: ``layer`` applied on ``parent`` (kept when it exists)."""
        key = f"sandlot-commit-unpack-{uuid.uuid4().hex[:12]}"
        mounts = self._snapshot(key, parent, budget, lease, view=False)
        try:
            what = f"Diff.Apply {layer['digest']}"
            self._conn.call(
                self._conn.diff.Apply,
                diff_pb2.ApplyRequest(
                    diff=descriptor_pb2.Descriptor(
                        media_type=MEDIA_LAYER, digest=layer["digest"], size=int(layer["size"])
                    ),
                    mounts=mounts,
                ),
                timeout=budget,
                what=what,
                lease=lease,
            )
            self._conn.call(
                self._conn.snapshots.Commit,
                snapshots_pb2.CommitSnapshotRequest(
                    snapshotter=self.snapshotter, name=name, key=key
                ),
                timeout=budget,
                what=f"Snapshots.Commit {name}",
                lease=lease,
            )
        except RuntimeError_ as exc:
            self._remove(key, budget)
            if exc.code != "already_exists":  # the same filesystem committed before
                raise

    def _write(
        self, digest: str, data: bytes, labels: Mapping[str, str], budget: Deadline, lease: str
    ) -> None:
        ref = f"sandlot-commit-{uuid.uuid4().hex[:12]}"

        def requests() -> Iterator[Any]:
            yield content_pb2.WriteContentRequest(
                action=content_pb2.WRITE, ref=ref, total=len(data), expected=digest, data=data
            )
            yield content_pb2.WriteContentRequest(
                action=content_pb2.COMMIT,
                ref=ref,
                total=len(data),
                offset=len(data),
                expected=digest,
                labels=dict(labels),
            )

        self._conn.write_blob(requests(), digest, lease, budget)

    def _put_image(
        self, name: str, target: Any, labels: Mapping[str, str], budget: Deadline
    ) -> None:
        image = images_pb2.Image(name=name, target=target, labels=dict(labels))
        try:
            self._conn.call(
                self._conn.images.Create,
                images_pb2.CreateImageRequest(image=image),
                timeout=budget,
                what=f"Images.Create {name}",
            )
        except RuntimeError_ as exc:
            if exc.code != "already_exists":
                raise
            self._conn.call(
                self._conn.images.Update,
                images_pb2.UpdateImageRequest(
                    image=image,
                    update_mask=field_mask_pb2.FieldMask(
                        paths=["target", *(f"labels.{k}" for k in labels)]
                    ),
                ),
                timeout=budget,
                what=f"Images.Update {name}",
            )


__all__ = ["Committer", "committed_documents"]
