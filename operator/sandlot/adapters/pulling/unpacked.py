"""How many bytes a layer unpacks to, counted from its compressed bytes as they
arrive, so that a pull stops at its caps before the layer is applied to disk.

A layer blob is decompressed as containerd's applier decompresses it (gzip with
every member of a multi-member stream, zstd with every frame, or a plain tar;
chosen by the blob's first bytes, as containerd chooses) in bounded steps: no
step holds more than ``_STEP`` bytes of output, so a bomb costs time up to the
cap, never memory. The output goes through a tar header walker that knows which
members carry data (Go's ``archive/tar``, which the applier runs, reads no data
block for links, devices, directories and FIFOs) and how large a sparse file is
once written: its ``GNU.sparse.realsize`` (PAX) or old GNU ``S`` header's real
size, holes included, since an applier may write them as zeros.

A layer's unpacked bytes are its decompressed tar bytes plus, for each sparse
member, its real size less the bytes it stores. The walker refuses a header whose
checksum is wrong (the applier would too) and a PAX header over ``MAX_PAX_BYTES``.
"""

from __future__ import annotations

import zlib
from typing import IO, Any, cast

from sandlot.adapters.pulling.registry import RegistryError
from sandlot.policy.imagecaps import mib
from sandlot.policy.pulling import FailureKind

MAX_PAX_BYTES = 1 << 20
"""A PAX extended header larger than this is refused (Go's ``archive/tar`` caps it
at the same)."""
_STEP = 1 << 20  # most decompressed bytes one step makes
_BLOCK = 512
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_HEADER_ONLY = frozenset(b"123456")  # link, symlink, char, block, directory, FIFO


class CapExceeded(RegistryError):
    """A layer or an image unpacks to more than its cap."""

    def __init__(self, message: str) -> None:
        super().__init__(message, FailureKind.TOO_LARGE)


class ImageBudget:
    """The caps of one pull: per layer and for all the layers it unpacks."""

    def __init__(self, what: str, *, layer_cap: int, image_cap: int) -> None:
        self.what = what
        self.layer_cap = layer_cap
        self.image_cap = image_cap
        self.used = 0
        """Unpacked bytes of the layers this pull has counted so far."""
        self.counted: set[str] = set()
        """Digests of the layers metered so far."""

    def meter(self, digest: str) -> LayerMeter:
        """A meter for one layer blob, charged to this image."""
        self.counted.add(digest)
        return LayerMeter(self, digest)


class LayerMeter:
    """Fed a layer blob's chunks in order (``feed``), then ``finish``; raises
    ``CapExceeded`` as soon as the layer or its image is past a cap."""

    def __init__(self, budget: ImageBudget, digest: str) -> None:
        self._budget = budget
        self.digest = digest
        self.unpacked = 0
        self._head = b""
        self._inflate: _Decompressor | None = None
        self._tar = _TarWalker(digest)

    def feed(self, chunk: bytes) -> None:
        if self._inflate is None:
            self._head += chunk
            if len(self._head) < len(_ZSTD_MAGIC):
                return
            self._inflate = _decompressor(self._head, self.digest)
            chunk, self._head = self._head, b""
        self._inflate.feed(chunk, self._count)

    def finish(self) -> int:
        """The layer's unpacked bytes, once all its chunks were fed."""
        if self._inflate is None:
            self._inflate = _decompressor(self._head, self.digest)
            self._inflate.feed(self._head, self._count)
        self._inflate.finish(self._count)
        return self.unpacked

    def _count(self, out: bytes) -> None:
        extra = self._tar.walk(out)
        grown = len(out) + extra
        self.unpacked += grown
        budget = self._budget
        budget.used += grown
        if self.unpacked > budget.layer_cap:
            raise CapExceeded(
                f"{budget.what}: layer {self.digest} unpacks to more than "
                f"{mib(budget.layer_cap)}, the cap on a layer (image_max_unpacked_layer)"
            )
        if budget.used > budget.image_cap:
            raise CapExceeded(
                f"{budget.what}: its layers unpack to more than {mib(budget.image_cap)}, "
                "the cap on an image (image_max_unpacked)"
            )


class _Decompressor:
    def feed(self, data: bytes, out: Any) -> None:
        raise NotImplementedError

    def finish(self, out: Any) -> None:
        raise NotImplementedError


class _Plain(_Decompressor):
    def feed(self, data: bytes, out: Any) -> None:
        if data:
            out(data)

    def finish(self, out: Any) -> None:
        pass


class _Gzip(_Decompressor):
    """Every member of a gzip stream, as Go's reader reads them (multistream)."""

    def __init__(self, digest: str) -> None:
        self._digest = digest
        self._inflate = zlib.decompressobj(wbits=31)

    def feed(self, data: bytes, out: Any) -> None:
        try:
            while True:
                made = self._inflate.decompress(data, _STEP)
                if made:
                    out(made)
                if self._inflate.eof:
                    data = self._inflate.unused_data
                    if not data:
                        return
                    self._inflate = zlib.decompressobj(wbits=31)  # the next member
                    continue
                data = self._inflate.unconsumed_tail
                if not data and len(made) < _STEP:
                    return
        except zlib.error as exc:
            raise RegistryError(
                f"layer {self._digest} is not a readable gzip stream: {exc}"
            ) from exc

    def finish(self, out: Any) -> None:
        self.feed(b"", out)
        if not self._inflate.eof:
            raise RegistryError(f"layer {self._digest}: its gzip stream ends early")


class _Zstd(_Decompressor):
    """Every frame of a zstd stream, written out in steps of at most ``_STEP``."""

    def __init__(self, digest: str) -> None:
        import zstandard

        self._digest = digest
        self._error = zstandard.ZstdError
        self._sink = _Sink()
        self._writer = zstandard.ZstdDecompressor().stream_writer(
            cast("IO[bytes]", self._sink), write_size=_STEP, write_return_read=True
        )

    def feed(self, data: bytes, out: Any) -> None:
        self._sink.out = out
        try:
            self._writer.write(data)
        except self._error as exc:
            raise RegistryError(
                f"layer {self._digest} is not a readable zstd stream: {exc}"
            ) from exc

    def finish(self, out: Any) -> None:
        pass  # each write hands every byte it could decompress to the sink


class _Sink:
    out: Any = None

    def write(self, data: bytes) -> int:
        self.out(bytes(data))
        return len(data)


def _decompressor(head: bytes, digest: str) -> _Decompressor:
    if head.startswith(_GZIP_MAGIC):
        return _Gzip(digest)
    if head.startswith(_ZSTD_MAGIC):
        return _Zstd(digest)
    return _Plain()


class _TarWalker:
    """Walks tar headers in a stream of bytes; ``walk`` returns the bytes the
    members seen in it add beyond their stored data (sparse files' holes)."""

    def __init__(self, digest: str) -> None:
        self._digest = digest
        self._offset = 0  # of the stream, for messages
        self._skip = 0  # data bytes (padded) still to pass
        self._pending = b""  # part of a header, or of a PAX header's data
        self._want = _BLOCK  # bytes _pending must reach before it is read
        self._reading: bytes | None = None  # type of the data being collected, if any
        self._pax: dict[str, str] = {}  # the next member's PAX records
        self._extensions = 0  # old GNU sparse extension blocks still to pass
        self._ended = False

    def walk(self, data: bytes) -> int:
        extra = 0
        view = memoryview(data)
        while view and not self._ended:
            if self._skip:
                step = min(self._skip, len(view))
                self._skip -= step
                self._offset += step
                view = view[step:]
                continue
            take = min(self._want - len(self._pending), len(view))
            self._pending += bytes(view[:take])
            self._offset += take
            view = view[take:]
            if len(self._pending) < self._want:
                break
            block, self._pending = self._pending, b""
            if self._reading is not None:
                self._read_extended(block)
            elif self._extensions:
                self._extensions = 1 if block[504] else 0
            else:
                extra += self._header(block)
        return extra

    def _read_extended(self, data: bytes) -> None:
        kind, self._reading, self._want = self._reading, None, _BLOCK
        if kind == b"x":
            self._pax.update(_pax_records(data, self._digest))

    def _header(self, block: bytes) -> int:
        if block == bytes(_BLOCK):
            return 0  # end of archive, or padding after it
        self._check(block)
        kind = block[156:157]
        size = _number(block[124:136], self._digest)
        padded = -(-size // _BLOCK) * _BLOCK
        if kind in (b"x", b"g", b"L", b"K"):
            if kind == b"x":
                if size > MAX_PAX_BYTES:
                    raise RegistryError(
                        f"layer {self._digest}: a PAX header of {size} bytes, more than "
                        f"{mib(MAX_PAX_BYTES)}"
                    )
                if size:
                    self._reading, self._want = kind, padded
            else:
                self._skip = padded
            return 0
        pax, self._pax = self._pax, {}
        if "size" in pax:
            size = _pax_int(pax["size"], "size", self._digest)
        real = size
        if kind == b"S":
            real = _number(block[483:495], self._digest)
            self._extensions = 1 if block[482] else 0
        for key in ("GNU.sparse.realsize", "GNU.sparse.size"):
            if key in pax:
                real = _pax_int(pax[key], key, self._digest)
                break
        if kind and kind[0] in _HEADER_ONLY:
            return 0
        self._skip = -(-size // _BLOCK) * _BLOCK
        return max(0, real - size)

    def _check(self, block: bytes) -> None:
        stored = block[148:156]
        unsigned = sum(block[:148]) + 8 * 0x20 + sum(block[156:])
        signed = sum(b - 256 if b > 127 else b for b in block[:148]) + 8 * 0x20
        signed += sum(b - 256 if b > 127 else b for b in block[156:])
        try:
            want = int(stored.strip(b" \0") or b"0", 8)
        except ValueError:
            want = -1
        if want not in (unsigned, signed):
            raise RegistryError(
                f"layer {self._digest} is not a tar: the header at byte "
                f"{self._offset - _BLOCK} fails its checksum"
            )


def _number(field: bytes, digest: str) -> int:
    """A tar numeric field: octal text, or base-256 when its top bit is set."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field, "big", signed=False) & ~(0xFF << (8 * (len(field) - 1)))
        value |= (field[0] & 0x7F) << (8 * (len(field) - 1))
        if field[0] & 0x40:
            raise RegistryError(f"layer {digest}: a negative size in a tar header")
        return value
    text = field.strip(b" \0")
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise RegistryError(
            f"layer {digest}: a tar header's number {text[:16]!r} is not octal"
        ) from None


def _pax_records(data: bytes, digest: str) -> dict[str, str]:
    records: dict[str, str] = {}
    while data and data[0] != 0:
        length_text, _, _ = data.partition(b" ")
        try:
            length = int(length_text)
        except ValueError:
            raise RegistryError(f"layer {digest}: a malformed PAX record") from None
        record, data = data[:length], data[length:]
        if length <= len(length_text) + 1 or len(record) < length or not record.endswith(b"\n"):
            raise RegistryError(f"layer {digest}: a malformed PAX record")
        key, _, value = record[len(length_text) + 1 : -1].partition(b"=")
        records[key.decode(errors="replace")] = value.decode(errors="replace")
    return records


def _pax_int(text: str, key: str, digest: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise RegistryError(f"layer {digest}: PAX {key}={text[:32]!r} is not a size")
    return value


__all__ = ["MAX_PAX_BYTES", "CapExceeded", "ImageBudget", "LayerMeter"]
