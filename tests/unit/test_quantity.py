"""Kubernetes quantities as the agent's limits read them: ``policy.quantity``."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sandlot.policy.quantity import cpu_quota, memory_bytes, parse_quantity

MEMORY = {
    "512Ki": 512 * 1024,
    "256Mi": 256 * 2**20,
    "1Gi": 2**30,
    "1.5Gi": 1610612736,
    "2Ti": 2 * 2**40,
    "1Pi": 2**50,
    "1Ei": 2**60,
    "1000": 1000,
    "1k": 1000,
    "5M": 5_000_000,
    "1G": 10**9,
    "1T": 10**12,
    "1P": 10**15,
    "1E": 10**18,
    "1e3": 1000,
    "1.5E2": 150,
    "0.5Ki": 512,
    "100m": 1,  # a fraction of a byte rounds up, as Quantity.Value() does
    "+2Mi": 2 * 2**20,
    "0": 0,
}


@pytest.mark.parametrize(("text", "expected"), MEMORY.items(), ids=list(MEMORY))
def test_memory_bytes(text: str, expected: int) -> None:
    assert memory_bytes(text) == expected


CPU = {
    "100m": 10_000,
    "500m": 50_000,
    "0.5": 50_000,
    "1": 100_000,
    "2": 200_000,
    "1.25": 125_000,
    "1m": 1_000,  # the kernel's floor
    "0": 1_000,
    "250000u": 25_000,
    "2e-1": 20_000,
}


@pytest.mark.parametrize(("text", "expected"), CPU.items(), ids=list(CPU))
def test_cpu_quota(text: str, expected: int) -> None:
    assert cpu_quota(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "Gi", "1.5.2Gi", "12Q", "1Kb", "ten", "1 Gi", "1e", "--1", "0x10", "1e99"],
    ids=[
        "empty",
        "suffix-only",
        "two-points",
        "unknown-suffix",
        "bytes-suffix",
        "word",
        "inner-space",
        "bare-exponent",
        "double-sign",
        "hex",
        "exponent-out-of-range",
    ],
)
def test_garbage_is_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text).replace(".", r"\.")):
        parse_quantity(text)


@pytest.mark.parametrize("parse", [memory_bytes, cpu_quota], ids=["memory", "cpu"])
def test_negative_limit_is_refused_naming_the_value(parse: object) -> None:
    with pytest.raises(ValueError, match="'-1Gi'"):
        parse("-1Gi")  # type: ignore[operator]


def test_parse_is_exact() -> None:
    assert parse_quantity("1.1") == Decimal("1.1")
