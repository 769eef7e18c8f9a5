"""Suspended state and snapshots, sealed: pushed encrypted under the key of the
sandbox (or snapshot) they belong to, and opened only where that key was brokered.

The registry holds one credential for every node, so it cannot keep one node
from another tenant's state; a key per owner can. Each blob of the committed
image (layers and config) is cut into 1 MiB chunks sealed with AES-256-GCM, the
nonce a prefix derived from the key and the blob's own digest plus the chunk's
index, the additional data the blob's digest and whether the chunk is the last
(no chunk moves, no blob is cut short or swapped for another). The image's
manifest is sealed the same way and pushed as the config of an OCI manifest
whose layers are the sealed blobs, in ``manifest_blobs`` order. Sealing is
deterministic for one key (the same state pushed again is the same digest, and a
retried push uploads nothing twice); without the key the registry serves only
ciphertext, and a node given no key opens nothing.

A pull opens the manifest, then streams each sealed blob through the cipher into
containerd's content store under its own digest (checked again on commit), and
unpacks it as any pull does (``steps``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sandlot.adapters.containerd.containers import chain_id, manifest_gc_labels, snapshot_gc_labels
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling.puller import ContainerdPuller, PullResult
from sandlot.adapters.pulling.push import BlobOpener, Pushed, manifest_blobs, push_image
from sandlot.adapters.pulling.registry import Credential, Endpoint, RegistryClient, RegistryError
from sandlot.adapters.pulling.steps import Counter
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.policy.imagecaps import MAX_CONFIG_BYTES
from sandlot.policy.pulling import FailureKind, ImageReference

KEY_BYTES = 32
"""AES-256."""
CHUNK = 1 << 20
"""Plaintext bytes per sealed chunk."""
TAG = 16
MAGIC = b"SLS1"
HEADER = len(MAGIC) + 8
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SEALED_MANIFEST = "application/vnd.sandlot.state.manifest.v1+sealed"
SEALED_BLOB = "application/vnd.sandlot.state.blob.v1+sealed"
MANIFEST_LABEL = "sandlot-state-manifest"


class SealError(RegistryError):
    """The state cannot be opened: no key for it here, the wrong key, or altered bytes."""

    def __init__(self, message: str) -> None:
        super().__init__(message, FailureKind.UNAUTHORIZED)


def sealed_size(size: int) -> int:
    """Bytes of a sealed blob of ``size`` plaintext bytes."""
    chunks = max(1, -(-size // CHUNK))
    return HEADER + size + TAG * chunks


def _rechunk(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``chunks`` as pieces of ``size`` bytes (the last shorter)."""
    buffer = bytearray()
    for piece in chunks:
        buffer += piece
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


def seal(
    key: bytes, label: str, digest: str, size: int, chunks: Iterable[bytes]
) -> Iterator[bytes]:
    """The sealed form of a blob of ``size`` bytes whose digest is ``digest``;
    ``label`` is the additional data (the blob's digest, or ``MANIFEST_LABEL``)."""
    prefix = hmac.new(key, f"{label}\0{digest}".encode(), hashlib.sha256).digest()[:8]
    cipher, total = AESGCM(key), max(1, -(-size // CHUNK))
    yield MAGIC + prefix
    index, seen = 0, 0
    for piece in _rechunk(chunks, CHUNK) if size else [b""]:
        seen += len(piece)
        if index >= total or seen > size:
            raise RegistryError(f"blob {digest} is longer than its {size} bytes")
        last = b"\1" if index == total - 1 else b"\0"
        yield cipher.encrypt(prefix + index.to_bytes(4, "big"), piece, label.encode() + last)
        index += 1
    if index != total or seen != size:
        raise RegistryError(f"blob {digest}: {seen} bytes read, {size} expected")


def open_sealed(key: bytes, label: str, size: int, sealed: Iterable[bytes]) -> Iterator[bytes]:
    """The plaintext (``size`` bytes) of a sealed blob; ``SealError`` for the wrong key
    or altered, reordered or truncated bytes."""
    cipher, total = AESGCM(key), max(1, -(-size // CHUNK))
    stream = _rechunk(sealed, CHUNK + TAG)
    header = b""
    pieces: Iterator[bytes] = iter(())
    for first in stream:
        header, rest = first[:HEADER], first[HEADER:]
        pieces = _rechunk(_chain(rest, stream), CHUNK + TAG)
        break
    if len(header) != HEADER or not header.startswith(MAGIC):
        raise SealError(f"{label}: not sealed state")
    prefix, index = header[len(MAGIC) :], 0
    for piece in pieces:
        if index >= total:
            raise SealError(f"{label}: longer than sealed")
        last = b"\1" if index == total - 1 else b"\0"
        try:
            yield cipher.decrypt(prefix + index.to_bytes(4, "big"), piece, label.encode() + last)
        except InvalidTag:
            raise SealError(f"{label}: cannot be opened with this key") from None
        index += 1
    if index != total:
        raise SealError(f"{label}: cut short")


def _chain(first: bytes, rest: Iterable[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_sealed(
    client: RegistryClient,
    tag: str,
    manifest: bytes,
    media_type: str,
    open_blob: BlobOpener,
    key: bytes,
) -> Pushed:
    """The image ``manifest`` names, sealed under ``key``, pushed as ``tag``."""
    try:
        parsed = json.loads(manifest)
    except ValueError as exc:
        raise RegistryError("the manifest to push is not JSON") from exc
    openers: dict[str, Callable[[], Iterator[bytes]]] = {}
    layers = []
    for digest, size in manifest_blobs(parsed):

        def sealed_blob(digest: str = digest, size: int = size) -> Iterator[bytes]:
            return seal(key, digest, digest, size, open_blob(digest))

        hasher = hashlib.sha256()
        for piece in sealed_blob():  # a first read for its digest; deterministic, so exact
            hasher.update(piece)
        sealed_digest = "sha256:" + hasher.hexdigest()
        openers[sealed_digest] = sealed_blob
        layers.append(
            {"mediaType": SEALED_BLOB, "digest": sealed_digest, "size": sealed_size(size)}
        )
    inner = json.dumps(
        {"mediaType": media_type, "manifest": base64.b64encode(manifest).decode()}
    ).encode()
    config = b"".join(seal(key, MANIFEST_LABEL, _digest(inner), len(inner), [inner]))
    openers[_digest(config)] = lambda: iter([config])
    wrapper = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": SEALED_MANIFEST,
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": layers,
        },
        separators=(",", ":"),
    ).encode()
    return push_image(client, tag, wrapper, OCI_MANIFEST, lambda d: openers[d]())


def open_manifest(key: bytes, wrapper: Mapping[str, Any], sealed: bytes) -> tuple[bytes, str]:
    """The sealed image's own manifest and its media type, from the wrapper's config."""
    config = wrapper.get("config") or {}
    if config.get("mediaType") != SEALED_MANIFEST:
        raise SealError("not sealed state (its manifest names no sealed config)")
    inner = b"".join(open_sealed(key, MANIFEST_LABEL, _plain_size(len(sealed)), [sealed]))
    document = json.loads(inner)
    return base64.b64decode(document["manifest"]), str(document["mediaType"])


def _plain_size(sealed: int) -> int:
    """Plaintext bytes of a sealed blob of ``sealed`` bytes (``sealed_size`` undone)."""
    body = sealed - HEADER
    chunks = max(1, -(-body // (CHUNK + TAG)))
    return body - TAG * chunks


class SealedPuller(ContainerdPuller):
    """Pulls sealed state into the node's store, opening it with its owner's key."""

    def pull_sealed(
        self,
        name: str,
        ref: ImageReference,
        endpoints: list[Endpoint],
        credential: Credential | None,
        key: bytes,
        *,
        deadline: float,
    ) -> PullResult:
        """Pull the sealed ``ref`` into the record ``name``, opened with ``key``; the
        first endpoint that serves it wins (mirrors first)."""
        budget = Deadline(deadline, what=f"pull {name}", expired=RuntimeTimeout)
        return self._on_endpoints(
            ref,
            endpoints,
            credential,
            budget,
            lambda client: self._pull_sealed(client, name, ref, key, budget),
            f"pull {name}",
        )

    def _pull_sealed(
        self, client: RegistryClient, name: str, ref: ImageReference, key: bytes, budget: Deadline
    ) -> PullResult:
        started = time.monotonic()
        wrapper_bytes, _ = client.manifest(ref.reference)
        if ref.digest and _digest(wrapper_bytes) != ref.digest:
            raise RegistryError(f"{ref.name}: the registry sent {_digest(wrapper_bytes)}")
        wrapper = json.loads(wrapper_bytes)
        sealed_config = self._small_blob(client, wrapper.get("config") or {})
        manifest_bytes, media_type = open_manifest(key, wrapper, sealed_config)
        manifest = json.loads(manifest_bytes)
        blobs = manifest_blobs(manifest)
        sealed_layers = list(wrapper.get("layers") or [])
        if len(sealed_layers) != len(blobs):
            raise SealError(f"{ref.name}: {len(sealed_layers)} sealed blobs for {len(blobs)}")
        sealed_of = {digest: dict(s) for (digest, _), s in zip(blobs, sealed_layers, strict=True)}
        config_desc, layers = manifest["config"], list(manifest.get("layers") or [])
        counter = Counter(sum(int(s["size"]) for s in sealed_layers), None)
        lease = self._create_lease(budget)
        caps = self.image_budget(name)
        try:
            config_bytes = self._opened(client, key, config_desc, sealed_of, MAX_CONFIG_BYTES)
            diff_ids = list((json.loads(config_bytes).get("rootfs") or {}).get("diff_ids") or [])
            if len(diff_ids) != len(layers):
                raise RegistryError(f"{ref.name}: config lists {len(diff_ids)} layers")
            for layer, diff_id in zip(layers, diff_ids, strict=True):
                self._ensure_opened(client, key, layer, sealed_of, diff_id, budget, lease, counter)
            self._unpack(layers, diff_ids, budget, lease, caps)
            gc_snapshot = snapshot_gc_labels(self.snapshotter, chain_id(diff_ids))
            self._write(config_desc, [config_bytes], gc_snapshot, budget, lease)
            layer_digests = [layer["digest"] for layer in layers]
            labels = manifest_gc_labels(config_desc["digest"], layer_digests)
            target = {
                "digest": _digest(manifest_bytes),
                "size": len(manifest_bytes),
                "mediaType": manifest.get("mediaType") or media_type,
            }
            self._write(target, [manifest_bytes], labels, budget, lease)
            self._put_image(name, target, {}, budget)
        finally:
            self._delete_lease(lease)
        return PullResult(
            name, str(target["digest"]), counter.total, counter.fetched, time.monotonic() - started
        )

    def _opened(
        self,
        client: RegistryClient,
        key: bytes,
        desc: Mapping[str, Any],
        sealed_of: Mapping[str, Mapping[str, Any]],
        cap: int,
    ) -> bytes:
        digest, size = str(desc["digest"]), int(desc["size"])
        if size > cap:
            raise RegistryError(f"{digest}: {size} bytes, past the cap", FailureKind.TOO_LARGE)
        sealed = sealed_of[digest]
        data = b"".join(
            open_sealed(key, digest, size, client.blob(sealed["digest"], limit=sealed_size(size)))
        )
        if _digest(data) != digest:
            raise SealError(f"blob {digest}: opened to content of digest {_digest(data)}")
        return data

    def _ensure_opened(
        self,
        client: RegistryClient,
        key: bytes,
        layer: Mapping[str, Any],
        sealed_of: Mapping[str, Mapping[str, Any]],
        diff_id: str,
        budget: Deadline,
        lease: str,
        counter: Counter,
    ) -> None:
        digest, size = str(layer["digest"]), int(layer["size"])
        labels = {"containerd.io/uncompressed": diff_id}
        sealed = sealed_of[digest]
        if self._info(digest, budget) is not None:
            self._label(digest, labels, budget)
            counter.add(int(sealed["size"]), fetched=False)
            return

        def opened() -> Iterator[bytes]:
            raw = client.blob(str(sealed["digest"]), limit=sealed_size(size))
            for piece in open_sealed(key, digest, size, raw):
                counter.add(len(piece), fetched=True)
                yield piece

        self._write(layer, opened(), labels, budget, lease)


__all__ = [
    "KEY_BYTES",
    "SEALED_BLOB",
    "SEALED_MANIFEST",
    "SealError",
    "SealedPuller",
    "open_manifest",
    "open_sealed",
    "push_sealed",
    "seal",
    "sealed_size",
]
