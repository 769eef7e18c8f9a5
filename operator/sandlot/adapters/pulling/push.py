"""Pushing an image from a node's content store to a registry (the OCI distribution
spec's push), for a suspended sandbox's state and anything else kept off-node.

``push_image`` sends the blobs a manifest names, then the manifest under a tag:
each blob is asked for first (``HEAD``) and skipped when the registry has it (a
base image's layers, a state pushed before); a missing one is uploaded in one
streamed ``PUT`` (``POST`` opens the upload, the ``PUT`` closes it with the
digest, which the registry checks). The bytes come from ``open_blob`` in chunks
as they are read and go out as they come, under a ``Content-Length``: nothing
holds a whole layer. Every request is the client's, so bounded by its stall
timeout and deadline, and their number by the manifest's (capped) blob count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from sandlot.adapters.pulling.registry import RegistryClient, RegistryError
from sandlot.policy.pulling import FailureKind

MAX_PUSH_BLOBS = 256
"""Blobs one push sends at most (a config and its layers): bounds its requests."""

BlobOpener = Callable[[str], Iterator[bytes]]
"""A blob's bytes by digest, in chunks (the node's content store)."""


@dataclass(frozen=True)
class Pushed:
    reference: str
    """``repository:tag@digest``, what a pull of exactly this state names."""
    digest: str
    uploaded: int
    """Blobs sent (the others the registry had)."""


def manifest_blobs(manifest: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The (digest, size) of the config and layers a manifest names, in push order
    (layers first, the config last), each once; past ``MAX_PUSH_BLOBS`` refused."""
    entries = [*(manifest.get("layers") or []), manifest.get("config") or {}]
    blobs: list[tuple[str, int]] = []
    for entry in entries:
        digest, size = str(entry.get("digest") or ""), entry.get("size")
        if not digest.startswith("sha256:") or not isinstance(size, int) or size < 0:
            raise RegistryError(f"manifest names a blob without digest or size: {entry!r:.200}")
        if (digest, size) not in blobs:
            blobs.append((digest, size))
    if len(blobs) > MAX_PUSH_BLOBS:
        raise RegistryError(
            f"manifest names {len(blobs)} blobs, more than {MAX_PUSH_BLOBS}", FailureKind.TOO_LARGE
        )
    return blobs


def _has_blob(client: RegistryClient, digest: str) -> bool:
    try:
        client.request(f"/{client.repository}/blobs/{digest}", {}, method="HEAD")
    except RegistryError as exc:
        if exc.kind is FailureKind.NOT_FOUND:
            return False
        raise
    return True


def _upload(client: RegistryClient, digest: str, size: int, open_blob: BlobOpener) -> None:
    status, headers = client.request(
        f"/{client.repository}/blobs/uploads/", {"Content-Length": "0"}, method="POST"
    )
    location = headers.get("Location")
    if status != 202 or not location:
        raise RegistryError(f"upload of {digest}: the registry gave no upload location")
    if location.startswith("/"):
        location = client.endpoint.url.rstrip("/") + location
    joiner = "&" if "?" in location else "?"
    target = f"{location}{joiner}{urlencode({'digest': digest})}"

    def body() -> Iterator[bytes]:
        sent = 0
        for chunk in open_blob(digest):
            sent += len(chunk)
            if sent > size:
                raise RegistryError(f"blob {digest} is longer than its {size} bytes")
            yield chunk

    headers_out = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
    status, _ = client.request(target, headers_out, method="PUT", body=body)
    if status != 201:
        raise RegistryError(f"upload of {digest}: HTTP {status}, not 201 Created")


def push_image(
    client: RegistryClient, tag: str, manifest: bytes, media_type: str, open_blob: BlobOpener
) -> Pushed:
    """``manifest`` and every blob it names in ``client``'s repository under ``tag``."""
    try:
        parsed = json.loads(manifest)
    except ValueError as exc:
        raise RegistryError("the manifest to push is not JSON") from exc
    uploaded = 0
    for digest, size in manifest_blobs(parsed):
        if not _has_blob(client, digest):
            _upload(client, digest, size, open_blob)
            uploaded += 1
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    status, headers = client.request(
        f"/{client.repository}/manifests/{tag}",
        {"Content-Type": media_type, "Content-Length": str(len(manifest))},
        method="PUT",
        body=lambda: manifest,
    )
    if status != 201:
        raise RegistryError(f"manifest {tag}: HTTP {status}, not 201 Created")
    said = headers.get("Docker-Content-Digest")
    if said and said != digest:
        raise RegistryError(f"manifest {tag}: the registry says digest {said}, not {digest}")
    host = client.endpoint.url.split("://", 1)[-1].rstrip("/")
    return Pushed(f"{host}/{client.repository}:{tag}@{digest}", digest, uploaded)


__all__ = ["MAX_PUSH_BLOBS", "BlobOpener", "Pushed", "manifest_blobs", "push_image"]
