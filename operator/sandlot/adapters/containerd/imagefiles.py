"""Small files out of an image's layers, without unpacking it: the image's
``/etc/passwd`` and ``/etc/group`` for resolving a named ``USER``.

Layers are read top-down; the first layer that has the file (or a whiteout of it)
decides, as an overlay mount of the layers would. Only images that name their
user pay for this read. Each layer is streamed from the content store through the
decompressor and the tar reader, member by member, so memory stays at a chunk
whatever the layer holds; the decompressed bytes read are capped (a gzip bomb
stops at the cap, naming it), and the caller's deadline bounds the time.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sandlot.adapters.runtime import ImageTooLarge, RuntimeError_
from sandlot.policy.imagecaps import mib

MAX_FILE_BYTES = 1 << 20  # a passwd or group file larger than this is not one
_GZIP_MAGIC = b"\x1f\x8b"
_READ_SIZE = 256 * 1024  # tar read size in a layer: few calls per MiB, little held


class _LayerStream(io.RawIOBase):
    """A layer blob's chunks as a file of its tar bytes: gunzipped when it is gzip
    (by media type or magic), counted against the lookup's budget of decompressed
    bytes (``ImageTooLarge`` once past it)."""

    def __init__(
        self, chunks: Iterator[bytes], media_type: str, budget: list[int], cap: int, what: str
    ) -> None:
        self._chunks = chunks
        self._pending = b""
        self._budget = budget
        self._cap = cap
        self._what = what
        first = next(self._chunks, b"")
        gzipped = media_type.endswith("gzip") or first[:2] == _GZIP_MAGIC
        self._inflate = zlib.decompressobj(wbits=31) if gzipped else None
        self._input = first

    def readable(self) -> bool:
        return True

    def _produce(self, size: int) -> bytes:
        while True:
            if not self._input:
                self._input = next(self._chunks, b"")
                if not self._input:
                    return self._inflate.flush() if self._inflate is not None else b""
            if self._inflate is None:
                out, self._input = self._input[:size], self._input[size:]
                return out
            out = self._inflate.decompress(self._input, size)
            self._input = self._inflate.unconsumed_tail
            if self._inflate.eof:
                # A gzip stream may have members after the first; tar needs no more.
                self._input = b""
            if out:
                return out

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        out = self._produce(len(view))
        self._budget[0] -= len(out)
        if self._budget[0] < 0:
            raise ImageTooLarge(
                f"{self._what}: more than {mib(self._cap)} of layer content read looking "
                "for /etc/passwd and /etc/group, the cap on the USER lookup"
            )
        view[: len(out)] = out
        return len(out)


def read_image_files(
    layers: Sequence[Mapping[str, Any]],
    open_blob: Callable[[str], Iterator[bytes]],
    paths: Sequence[str],
    *,
    max_bytes: int,
    what: str = "image",
) -> dict[str, str]:
    """The text of each of ``paths`` (absolute) as the image's root filesystem has
    it; a path the image lacks maps to ''. ``open_blob`` streams a blob's chunks;
    at most ``max_bytes`` of tar content are read over all layers."""
    wanted = {p.lstrip("/"): p for p in paths}
    found: dict[str, str] = {}
    budget = [max_bytes]
    for layer in reversed(layers):
        if len(found) == len(wanted):
            break
        media_type = str(layer.get("mediaType", ""))
        if media_type.endswith("+zstd"):
            raise RuntimeError_(f"layer of type {media_type} cannot be read here", code="invalid")
        chunks = open_blob(str(layer["digest"]))
        try:
            stream = _LayerStream(chunks, media_type, budget, max_bytes, what)
            _scan_layer(stream, wanted, found)
        except (tarfile.TarError, zlib.error, EOFError) as exc:
            raise RuntimeError_(
                f"{what}: layer {layer['digest']} is not a readable tar: {exc}", code="invalid"
            ) from exc
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
    return {wanted[name]: found.get(name, "") for name in wanted}


def _scan_layer(stream: io.RawIOBase, wanted: Mapping[str, str], found: dict[str, str]) -> None:
    with tarfile.open(fileobj=stream, mode="r|", bufsize=_READ_SIZE) as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            directory, _, base = name.rpartition("/")
            whited = f"{directory}/{base.removeprefix('.wh.')}".lstrip("/")
            if base.startswith(".wh.") and whited in wanted and whited not in found:
                found[whited] = ""
            elif name in wanted and name not in found and member.isfile():
                if member.size > MAX_FILE_BYTES:
                    raise RuntimeError_(f"/{name} in the image is too large", code="invalid")
                handle = archive.extractfile(member)
                found[name] = handle.read().decode(errors="replace") if handle else ""
            if len(found) == len(wanted):
                return
