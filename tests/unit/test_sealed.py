"""Sealing state blobs (``adapters.pulling.sealed``): what one key seals only that
key opens, whole and in order; the sizes a push announces are exact."""

from __future__ import annotations

import hashlib
import os

import pytest

from sandlot.adapters.pulling.sealed import (
    CHUNK,
    SealError,
    open_sealed,
    seal,
    sealed_size,
)

KEY, OTHER = os.urandom(32), os.urandom(32)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sealed(data: bytes, key: bytes = KEY, pieces: int = 7) -> bytes:
    d = digest(data)
    parts = [data[i : i + pieces] for i in range(0, len(data), pieces)] if data else []
    return b"".join(seal(key, d, d, len(data), parts))


SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5]


@pytest.mark.parametrize("size", SIZES, ids=[str(s) for s in SIZES])
def test_a_sealed_blob_opens_with_its_key_to_the_same_bytes_and_its_size_is_announced(
    size: int,
) -> None:
    data = os.urandom(size)
    box = sealed(data, pieces=4093)
    assert len(box) == sealed_size(size)
    assert size < 16 or data[:64] not in box  # a short one appears by chance in any bytes
    d = digest(data)
    assert (
        b"".join(open_sealed(KEY, d, size, [box[i : i + 999] for i in range(0, len(box), 999)]))
        == data
    )


def test_sealing_is_deterministic_for_one_key_and_differs_between_keys() -> None:
    data = b"kept-mover\n" * 1000
    assert sealed(data) == sealed(data, pieces=13)
    assert sealed(data) != sealed(data, OTHER)


def test_another_key_opens_nothing() -> None:
    data = b"tenant secret" * 100
    with pytest.raises(SealError, match="cannot be opened"):
        b"".join(open_sealed(OTHER, digest(data), len(data), [sealed(data)]))


def test_a_blob_sealed_for_one_digest_does_not_open_as_another() -> None:
    data, other = b"a" * 100, b"b" * 100
    with pytest.raises(SealError):
        b"".join(open_sealed(KEY, digest(other), len(data), [sealed(data)]))


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda b: b[: -(CHUNK // 2)], id="cut-short"),
        pytest.param(
            lambda b: b[:12] + b[12 + CHUNK + 16 :] + b[12 : 12 + CHUNK + 16], id="reordered"
        ),
        pytest.param(lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], id="one-bit-flipped"),
    ],
)
def test_altered_sealed_bytes_do_not_open(cut: object) -> None:
    data = os.urandom(2 * CHUNK + 100)
    box = cut(sealed(data))  # type: ignore[operator]
    with pytest.raises(SealError):
        b"".join(open_sealed(KEY, digest(data), len(data), [box]))
