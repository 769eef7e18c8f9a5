"""Kubernetes resource quantities (``512Mi``, ``1.5Gi``, ``100m``, ``1e3``) as numbers.

The grammar is Kubernetes' own (``k8s.io/apimachinery/pkg/api/resource``): a
signed decimal number, then a binary suffix (``Ki`` .. ``Ei``), a decimal suffix
(``n``, ``u``, ``m``, ``k``, ``M``, ``G``, ``T``, ``P``, ``E``) or a decimal exponent
(``e3``, ``E-2``). Arithmetic is exact (``Decimal``), so ``1.5Gi`` is exactly
1610612736 bytes; a fractional byte count rounds up, as Kubernetes' ``Value()`` does.
Anything else raises ``ValueError`` naming the text, never a ``KeyError`` deep in a
start-up.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    # k = 10^3, M = 10^6 ... E = 10^18; Ki = 2^10, Mi = 2^20 ... Ei = 2^60.
    **{prefix: Decimal(10) ** (3 * i) for i, prefix in enumerate("kMGTPE", start=1)},
    **{f"{prefix}i": Decimal(2) ** (10 * i) for i, prefix in enumerate("KMGTPE", start=1)},
}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
# Beyond this an exponent is a typo, not a quantity (Kubernetes caps them likewise).
_MAX_EXPONENT = 30

CFS_PERIOD_US = 100_000
"""The CFS period (microseconds) a CPU limit's quota is a share of."""
MIN_CFS_QUOTA_US = 1_000
"""The smallest quota written (microseconds per period): the kernel refuses less."""


def parse_quantity(text: str) -> Decimal:
    """The exact value of a Kubernetes quantity; ``ValueError`` naming ``text`` otherwise."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (like 512Mi, 1.5Gi, 100m)")
    number = Decimal(match["number"])
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"{text!r}: exponent {exponent} is out of range")
        return number.scaleb(exponent)
    return number * _SUFFIXES[match["suffix"] or ""]


def _non_negative(text: str, what: str) -> Decimal:
    value = parse_quantity(text)
    if value < 0:
        raise ValueError(f"{what} {text!r} is negative")
    return value


def memory_bytes(text: str) -> int:
    """A memory quantity in bytes, a fraction of a byte rounded up (``1.5Gi``, ``512Ki``)."""
    value = _non_negative(text, "memory quantity")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def cpu_quota(text: str, period: int = CFS_PERIOD_US) -> int:
    """The CFS quota (microseconds per ``period``) of a CPU quantity (``100m``, ``0.5``, ``2``);
    at least ``MIN_CFS_QUOTA_US``."""
    cores = _non_negative(text, "cpu quantity")
    quota = int((cores * period).to_integral_value(rounding=ROUND_FLOOR))
    return max(MIN_CFS_QUOTA_US, quota)


__all__ = ["CFS_PERIOD_US", "MIN_CFS_QUOTA_US", "cpu_quota", "memory_bytes", "parse_quantity"]
