"""Images over containerd's gRPC API: configs, sizes, labels, deletes and collection.

An image's config is found as containerd's Go client finds it: the record's
target, this platform's manifest (from an index if it is one), its config blob.
An image's size is the bytes of the distinct blobs it references that are in the
content store, cached by digest (content is immutable); so are the manifests and
configs themselves (``documents``), while every record is read again per call.

A delete removes the record only. containerd can collect the content and
snapshots the record held in the same call (``sync``), but that runs a whole
garbage collection per image: a pass over hundreds of images then spends almost
all its time collecting. So deletes never ask for it, and ``collect_garbage``
collects once for the whole pass: it deletes a lease made for the purpose with
``sync``, which makes containerd collect before it answers whatever became
unreferenced, by whichever delete.
"""

from __future__ import annotations

import platform
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import field_mask_pb2

from sandlot.adapters.containerd.connection import Connection, json_object, to_datetime
from sandlot.adapters.containerd.documents import Documents
from sandlot.adapters.containerd.gen.services.images.v1 import images_pb2
from sandlot.adapters.containerd.imagefiles import read_image_files
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import (
    ImageConfig,
    ImageRecord,
    ImageTooLarge,
    NotFound,
    RuntimeError_,
    RuntimeTimeout,
)
from sandlot.policy.imagecaps import (
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_USER_LOOKUP_BYTES,
    mib,
)
from sandlot.policy.imageuser import needs_lookup

INDEX_MEDIA_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)
_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# The lease whose synchronous delete runs a collection holds nothing; should its
# delete never arrive, containerd drops it after this.
GC_LEASE_TTL = timedelta(minutes=10)


def host_architecture() -> str:
    machine = platform.machine().lower()
    return _GOARCH.get(machine, machine)


class Images:
    """The image half of the ``Runtime``, on one ``Connection``."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        # Blobs referenced by a manifest or index, by its digest: content is immutable.
        self._blob_cache: dict[str, dict[str, int]] = {}
        # The indexes, manifests and configs starts read, by digest (the same reason).
        self._documents = Documents()

    def _document(self, digest: str, budget: Deadline, what: str, *, limit: int) -> dict[str, Any]:
        """The JSON blob ``digest`` (at most ``limit`` bytes), read once per digest."""
        data = self._documents.get(digest)
        if data is None:
            data = self._conn.read_blob(
                digest, timeout=budget.remaining(what), what=what, limit=limit
            )
            self._documents.put(digest, data)
        elif len(data) > limit:
            raise ImageTooLarge(f"{what}: read {digest}: more than {mib(limit)}, the cap")
        return json_object(data, digest, what)

    # -- configs -------------------------------------------------------------------

    def _platform_manifest(
        self, image: str, descriptor: Mapping[str, Any], budget: Deadline
    ) -> dict[str, Any]:
        """The image manifest for linux/this architecture, resolving an index if needed."""
        what = f"image {image}"
        document = self._document(str(descriptor["digest"]), budget, what, limit=MAX_MANIFEST_BYTES)
        media_type = descriptor.get("mediaType") or document.get("mediaType", "")
        if media_type not in INDEX_MEDIA_TYPES and "manifests" not in document:
            return document
        arch = host_architecture()
        for entry in document.get("manifests", []):
            plat = entry.get("platform") or {}
            if plat.get("os") == "linux" and plat.get("architecture") == arch:
                return self._platform_manifest(image, entry, budget)
        raise NotFound(f"{what}: no linux/{arch} manifest in its index")

    def _target(self, image: str, budget: Deadline) -> Any:
        try:
            response = self._conn.call(
                self._conn.images.Get,
                images_pb2.GetImageRequest(name=image),
                timeout=budget,
                what=f"Images.Get {image}",
            )
        except NotFound as exc:
            raise NotFound(f"image {image} not found in namespace {self._conn.namespace}") from exc
        return response.image.target

    def target(self, image: str, budget: Deadline) -> Any:
        """The descriptor the image record ``image`` points at."""
        return self._target(image, budget)

    def layers(self, image: str, budget: Deadline) -> list[dict[str, Any]]:
        """The descriptors of the image's layers (this platform's manifest), base first."""
        target = self._target(image, budget)
        manifest = self._platform_manifest(
            image, {"digest": target.digest, "mediaType": target.media_type}, budget
        )
        return list(manifest.get("layers") or [])

    def stored_manifest(self, image: str, budget: Deadline) -> tuple[bytes, str]:
        """The bytes and media type of the manifest (or index) the image's record names."""
        target = self._target(image, budget)
        what = f"image {image} manifest"
        data = self._conn.read_blob(
            target.digest, timeout=budget.remaining(what), what=what, limit=MAX_MANIFEST_BYTES
        )
        return data, str(target.media_type)

    def manifest(self, image: str, budget: Deadline) -> dict[str, Any]:
        """The image's manifest for this platform."""
        target = self._target(image, budget)
        return self._platform_manifest(
            image, {"digest": target.digest, "mediaType": target.media_type}, budget
        )

    def config_json(self, image: str, budget: Deadline) -> dict[str, Any]:
        """The image's config blob (``config``, ``rootfs`` and the rest), parsed."""
        target = self._target(image, budget)
        manifest = self._platform_manifest(
            image, {"digest": target.digest, "mediaType": target.media_type}, budget
        )
        config = manifest.get("config") or {}
        if "digest" not in config:
            raise RuntimeError_(f"image {image}: manifest has no config", code="invalid")
        what = f"image {image} config"
        size = int(config.get("size") or 0)
        if size > MAX_CONFIG_BYTES:
            raise ImageTooLarge(
                f"{what}: {size} bytes, more than {mib(MAX_CONFIG_BYTES)}, the cap on a config"
            )
        # Read no more than the manifest says it is (the content store checks the digest).
        return self._document(str(config["digest"]), budget, what, limit=size or MAX_CONFIG_BYTES)

    def image_config(self, image: str, *, timeout: float) -> ImageConfig:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        config = self.config_json(image, budget).get("config") or {}
        user = str(config.get("User") or "")
        files = self._image_files(image, budget) if needs_lookup(user) else {}
        return ImageConfig(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            working_dir=str(config.get("WorkingDir") or ""),
            user=user,
            passwd=files.get("/etc/passwd", ""),
            group=files.get("/etc/group", ""),
        )

    def _image_files(self, image: str, budget: Deadline) -> dict[str, str]:
        """The image's /etc/passwd and /etc/group, for a ``USER`` given by name."""
        target = self._target(image, budget)
        manifest = self._platform_manifest(
            image, {"digest": target.digest, "mediaType": target.media_type}, budget
        )
        what = f"image {image} layers"

        def open_blob(digest: str) -> Iterator[bytes]:
            return self._conn.open_blob(digest, timeout=budget.remaining(what), what=what)

        return read_image_files(
            manifest.get("layers") or [],
            open_blob,
            ("/etc/passwd", "/etc/group"),
            max_bytes=MAX_USER_LOOKUP_BYTES,
            what=f"image {image}",
        )

    # -- records -------------------------------------------------------------------

    def list_images(self, *, timeout: float) -> list[ImageRecord]:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        response = self._conn.call(
            self._conn.images.List,
            images_pb2.ListImagesRequest(),
            timeout=budget,
            what="Images.List",
        )
        records = []
        for image in response.images:
            created = to_datetime(image.created_at) or datetime.fromtimestamp(0, UTC)
            records.append(
                ImageRecord(
                    name=image.name,
                    size=self._content_size(
                        image.name,
                        {
                            "digest": image.target.digest,
                            "mediaType": image.target.media_type,
                            "size": image.target.size,
                        },
                        budget,
                    ),
                    created_at=created,
                    updated_at=to_datetime(image.updated_at) or created,
                    labels=dict(image.labels),
                    target_digest=image.target.digest,
                )
            )
        return records

    def _content_size(self, image: str, descriptor: Mapping[str, Any], budget: Deadline) -> int:
        """Bytes of the distinct blobs an image references that are in the content store."""
        blobs = self._referenced_blobs(image, descriptor, budget)
        return sum(blobs.values()) if blobs is not None else 0

    def _referenced_blobs(
        self, image: str, descriptor: Mapping[str, Any], budget: Deadline
    ) -> dict[str, int] | None:
        """Digest -> size of a manifest or index and all it references; None if it is absent.

        Cached by digest when complete (content is immutable); an index with a
        platform never fetched is not cached, since that content may arrive later.
        """
        digest = str(descriptor["digest"])
        if digest in self._blob_cache:
            return self._blob_cache[digest]
        try:
            document = self._conn.read_json(
                digest, budget, f"size of image {image}", limit=MAX_MANIFEST_BYTES
            )
        except NotFound:
            return None  # an index entry for a platform that was never fetched
        except ImageTooLarge:
            # Not a manifest anyone pulled through a cap: count the blob alone, so one
            # hostile record never stops a listing of the rest.
            return {digest: int(descriptor.get("size", 0))}
        blobs = {digest: int(descriptor.get("size", 0))}
        complete = True
        if descriptor.get("mediaType") in INDEX_MEDIA_TYPES or "manifests" in document:
            for entry in document.get("manifests", []):
                child = self._referenced_blobs(image, entry, budget)
                if child is None:
                    complete = False
                else:
                    blobs.update(child)
        else:
            for ref in [document.get("config") or {}, *document.get("layers", [])]:
                if "digest" in ref:
                    blobs[str(ref["digest"])] = int(ref.get("size", 0))
        if complete:
            self._blob_cache[digest] = blobs
        return blobs

    def delete_image(self, name: str, *, timeout: float) -> None:
        self._conn.call(
            self._conn.images.Delete,
            images_pb2.DeleteImageRequest(name=name, sync=False),
            timeout=timeout,
            what=f"Images.Delete {name}",
        )

    def collect_garbage(self, *, timeout: float) -> None:
        """One collection that began after every call made before this one returned.

        containerd answers a synchronous delete when the next collection ends; if
        one was already running, that is the one, and it may have marked what is
        referenced before the last deletes. So it is asked twice: the second
        answer comes from a collection that began after the first ended. A
        collection with nothing to remove costs milliseconds.
        """
        budget = Deadline(timeout, expired=RuntimeTimeout)
        for _ in range(2):
            lease = self._conn.create_lease(f"sandlot-gc-{uuid.uuid4().hex}", GC_LEASE_TTL, budget)
            self._conn.delete_lease(
                lease, timeout=budget.remaining(f"Leases.Delete {lease} (sync)"), sync=True
            )

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        """Set the given labels, keeping the others; an empty value removes that label.

        The update carries the record's current target although the mask names only
        labels: containerd 2.x decodes the whole image before applying the mask, and
        an image without a target crashes it (1.6 ignored the missing field).
        """
        if not labels:
            return
        budget = Deadline(timeout, expired=RuntimeTimeout)
        current = self._conn.call(
            self._conn.images.Get,
            images_pb2.GetImageRequest(name=name),
            timeout=budget,
            what=f"Images.Get {name}",
        ).image
        self._conn.call(
            self._conn.images.Update,
            images_pb2.UpdateImageRequest(
                image=images_pb2.Image(name=name, target=current.target, labels=dict(labels)),
                update_mask=field_mask_pb2.FieldMask(paths=[f"labels.{k}" for k in labels]),
            ),
            timeout=budget,
            what=f"Images.Update labels of {name}",
        )


__all__ = ["INDEX_MEDIA_TYPES", "Images", "host_architecture"]
