"""The one capped doubling every retry of sandlot waits by: ``first`` after the
first failure, twice as long after each further one, never longer than ``cap``.

Kept in one place because each copy chose its own edge (a zero count, an exponent
that overflows ``timedelta``, a cap below the first wait). Doubling stops at the
cap, so a count in the thousands costs a few steps and never overflows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

Delay = TypeVar("Delay", float, timedelta)


def capped_doubling(failures: int, first: Delay, cap: Delay) -> Delay:
    """The wait after ``failures`` consecutive failures (1, 2, ...): ``first`` doubled
    ``failures - 1`` times, at most ``cap``. No failures yet waits ``first`` too."""
    wait = min(first, cap)
    for _ in range(failures - 1):
        if wait >= cap:
            break
        wait = min(wait * 2, cap)
    return wait


__all__ = ["Delay", "capped_doubling"]
