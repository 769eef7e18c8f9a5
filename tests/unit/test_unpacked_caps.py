"""The bytes a layer unpacks to, counted from its compressed bytes as they arrive:
every compression containerd's applier reads, every member a tar holds, sparse
files at their full size, and the caps refused naming them."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
import zstandard

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.pulling.unpacked import CapExceeded, ImageBudget
from sandlot.policy.imagecaps import mib
from sandlot.policy.pulling import FailureKind

TIB = 2**40
NO_CAP = 2**62


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def _file(name: str, data: bytes, **pax: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.pax_headers = dict(pax)
    return info, data


def _count(
    blob: bytes, *, layer_cap: int = NO_CAP, image_cap: int = NO_CAP, chunk: int = 4093
) -> int:
    meter = ImageBudget("img:1", layer_cap=layer_cap, image_cap=image_cap).meter("sha256:l1")
    for i in range(0, len(blob), chunk):
        meter.feed(blob[i : i + chunk])
    return meter.finish()


PLAIN = _tar(_file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"), _file("big", b"z" * 300_000))


@pytest.mark.parametrize(
    "encode",
    [
        lambda raw: raw,
        gzip.compress,
        lambda raw: gzip.compress(raw[:10_000]) + gzip.compress(raw[10_000:]),
        zstandard.ZstdCompressor().compress,
        lambda raw: b"".join(
            zstandard.ZstdCompressor().compress(raw[i : i + 50_000])
            for i in range(0, len(raw), 50_000)
        ),
    ],
    ids=["tar", "gzip", "gzip in two members", "zstd", "zstd in seven frames"],
)
def test_every_compression_counts_the_tar_it_unpacks_to(encode: object) -> None:
    assert callable(encode)
    assert _count(encode(PLAIN)) == len(PLAIN)


def test_chunks_of_any_size_count_the_same() -> None:
    blob = gzip.compress(PLAIN)
    assert {_count(blob, chunk=size) for size in (1, 3, 512, 100_000)} == {len(PLAIN)}


def test_a_gzip_bomb_stops_at_the_layer_cap_while_it_is_fed() -> None:
    bomb = gzip.compress(_tar(_file("zeros", bytes(64 * 2**20))), compresslevel=1)
    meter = ImageBudget("bomb:1", layer_cap=8 * 2**20, image_cap=NO_CAP).meter("sha256:b0")
    fed = 0
    with pytest.raises(CapExceeded) as refused:
        for i in range(0, len(bomb), 4096):
            meter.feed(bomb[i : i + 4096])
            fed += 4096
    assert fed < len(bomb), "the whole bomb was fed before the cap was seen"
    assert refused.value.kind is FailureKind.TOO_LARGE
    assert "layer sha256:b0 unpacks to more than 8 MiB, the cap on a layer" in str(refused.value)
    assert "image_max_unpacked_layer" in str(refused.value)


def test_layers_under_their_cap_are_refused_past_the_images() -> None:
    layer = gzip.compress(_tar(_file("part", bytes(3 * 2**20))))
    caps = ImageBudget("many:1", layer_cap=4 * 2**20, image_cap=10 * 2**20)
    for n in range(3):
        meter = caps.meter(f"sha256:{n}")
        meter.feed(layer)
        meter.finish()
    with pytest.raises(CapExceeded) as refused:
        meter = caps.meter("sha256:3")
        meter.feed(layer)
    assert f"more than {mib(10 * 2**20)}, the cap on an image (image_max_unpacked)" in str(
        refused.value
    )
    assert caps.counted == {"sha256:0", "sha256:1", "sha256:2", "sha256:3"}


def test_a_pax_sparse_file_counts_at_its_real_size() -> None:
    # PAX sparse 1.0: the member stores its map and data blocks; the file is 1 TiB.
    stored = b"1\n0\n512\n".ljust(512, b"\0") + b"d" * 512
    sparse = _file(
        "GNUSparseFile.0/huge",
        stored,
        **{
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "huge",
            "GNU.sparse.realsize": str(TIB),
        },
    )
    raw = _tar(sparse)
    assert _count(raw) == len(raw) + TIB - len(stored)
    with pytest.raises(CapExceeded):
        _count(gzip.compress(raw), layer_cap=16 * 2**30)


def _gnu_sparse(name: str, stored: bytes, real: int, *, extended: bool) -> bytes:
    """An old GNU sparse member (type S), with one extension block when asked."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = len(stored)
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[482] = 1 if extended else 0
    header[483:495] = b"\x80" + real.to_bytes(11, "big")  # base-256: past octal's 8 GiB
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    out = bytes(header)
    if extended:
        out += bytes(504) + b"\0" + bytes(7)  # no more extension blocks
    return out + stored.ljust(-(-len(stored) // 512) * 512, b"\0")


def test_an_old_gnu_sparse_file_counts_at_its_real_size_past_its_extension_blocks() -> None:
    member = _gnu_sparse("huge", b"d" * 100, TIB, extended=True)
    after = _tar(_file("after", b"a" * 700))
    raw = member + after
    assert _count(raw) == len(raw) + TIB - 100


def test_header_only_members_carry_no_data_whatever_their_size_says() -> None:
    # Go's archive/tar reads no data for a link, symlink, device, directory or FIFO:
    # a walker that skipped the "size" would read past the sparse member after it.
    link = tarfile.TarInfo("link")
    link.type = tarfile.SYMTYPE
    link.linkname = "target"
    header = bytearray(link.tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"%011o\0" % 1024
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    member = _gnu_sparse("huge", b"d" * 10, TIB, extended=False)
    raw = bytes(header) + member + bytes(1024)
    assert _count(raw) == len(raw) + TIB - 10


def test_a_header_failing_its_checksum_is_refused_naming_where() -> None:
    raw = bytearray(PLAIN)
    raw[0] ^= 0x01  # the first header's name
    with pytest.raises(RegistryError) as refused:
        _count(bytes(raw))
    assert "is not a tar: the header at byte 0 fails its checksum" in str(refused.value)


def test_a_truncated_gzip_stream_is_refused() -> None:
    with pytest.raises(RegistryError) as refused:
        _count(gzip.compress(PLAIN)[:-100])
    assert "its gzip stream ends early" in str(refused.value)
