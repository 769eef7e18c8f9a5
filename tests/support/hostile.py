"""Hostile images and a hostile registry, for the tests and the abuse bench.

The image is a gzip bomb under ``USER nobody``: one layer holding 2 GiB of zeros
(about 9 MiB compressed) with its ``/etc/passwd`` after them, so resolving the user
means reading past the zeros.

A hostile registry is a server of its own (a real registry refuses to store what it
sends): a 100 MiB manifest, a config its manifest says is 1 GiB, and one that says
1000 bytes and then sends 1 GiB. It also serves the bomb image as it is
(``BOMB_REPOSITORY``), whose layer unpacks to 2 GiB.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sandlot.devtools.ociarchive import (
    ANNOTATION_IMAGE_NAME,
    ANNOTATION_REF_NAME,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER_GZIP,
    MEDIA_MANIFEST,
    host_platform,
)

ZEROS = 2 * 2**30
PASSWD = b"nobody:x:65534:65534:nobody:/:/bin/sh\n"


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


class _Hashing:
    """A write-only file that hashes what passes through it (the layer's diff ID)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.out.write(data)

    def tell(self) -> int:
        return 0


def _bomb_layer() -> tuple[bytes, str]:
    """The gzipped layer (2 GiB of zeros, then /etc/passwd) and its diff ID, streamed."""
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=1, mtime=0) as gz:
        plain = _Hashing(gz)  # type: ignore[arg-type]
        with tarfile.TarFile(
            fileobj=plain,  # type: ignore[arg-type]
            mode="w",
            format=tarfile.PAX_FORMAT,
            copybufsize=2**20,
        ) as tar:
            zeros = tarfile.TarInfo("zeros")
            zeros.size = ZEROS
            tar.addfile(zeros, _Zeros(ZEROS))
            passwd = tarfile.TarInfo("etc/passwd")
            passwd.size = len(PASSWD)
            tar.addfile(passwd, io.BytesIO(PASSWD))
    return compressed.getvalue(), "sha256:" + plain.sha.hexdigest()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}


@functools.cache
def bomb_image() -> tuple[bytes, bytes, bytes]:
    """The bomb image's manifest, config and layer (built once per process)."""
    layer, diff_id = _bomb_layer()
    config = json.dumps(
        {
            **host_platform(),
            "config": {"User": "nobody", "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": _descriptor(MEDIA_CONFIG, config),
            "layers": [_descriptor(MEDIA_LAYER_GZIP, layer)],
        }
    ).encode()
    return manifest, config, layer


def bomb_archive(dest: Path, name: str) -> Path:
    """An OCI archive of the bomb image named ``name``."""
    manifest, config, layer = bomb_image()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    **_descriptor(MEDIA_MANIFEST, manifest),
                    "platform": host_platform(),
                    "annotations": {ANNOTATION_IMAGE_NAME: name, ANNOTATION_REF_NAME: "test"},
                }
            ],
        }
    ).encode()
    files = {f"blobs/sha256/{_digest(b)[7:]}": b for b in (layer, config, manifest)}
    files.update({"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index})
    with tarfile.open(dest, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


_CONFIG_DIGEST = "sha256:" + "c" * 64


def _manifest(config_size: int) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": _CONFIG_DIGEST, "size": config_size},
            "layers": [],
        }
    ).encode()


BOMB_REPOSITORY = "gzip-bomb"
"""The bomb image, served as it is: a registry holds it as any other image."""

# Each repository is one way of lying: (manifest bytes or a size of junk to send, the
# config's size in the manifest, bytes of config actually sent).
HOSTILE: dict[str, tuple[bytes | int, int, int]] = {
    "huge-manifest": (100 * 2**20, 0, 0),
    "huge-config": (_manifest(2**30), 2**30, 0),
    "lying-config": (_manifest(1000), 1000, 2**30),
}


class _Hostile(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send_stream(self, size: int, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = b" " * 2**20
        with contextlib.suppress(OSError):  # the client hangs up at its cap
            for _ in range(size // len(chunk)):
                self.wfile.write(chunk)

    def _send(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client hangs up at its cap
            self.wfile.write(data)

    def do_GET(self) -> None:
        parts = self.path.split("/")  # /v2/<repo>/{manifests,blobs}/<ref>
        if len(parts) == 5 and parts[2] == BOMB_REPOSITORY:
            bomb_manifest, config, layer = bomb_image()
            blobs = {_digest(b): b for b in (config, layer)}
            if parts[3] == "manifests":
                self._send(bomb_manifest, MEDIA_MANIFEST)
                return
            if parts[3] == "blobs" and parts[4] in blobs:
                self._send(blobs[parts[4]], "application/octet-stream")
                return
        if len(parts) != 5 or parts[2] not in HOSTILE:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        manifest, _, config_sent = HOSTILE[parts[2]]
        if parts[3] == "blobs":
            self._send_stream(config_sent, "application/octet-stream")
        elif isinstance(manifest, int):
            self._send_stream(manifest, MEDIA_MANIFEST)
        else:
            self.send_response(200)
            self.send_header("Content-Type", MEDIA_MANIFEST)
            self.send_header("Content-Length", str(len(manifest)))
            self.end_headers()
            self.wfile.write(manifest)


@contextlib.contextmanager
def hostile_registry() -> Iterator[str]:
    """A hostile registry on loopback: its ``host:port``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
