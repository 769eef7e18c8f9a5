"""Bounded waiting for tests: poll with a deadline, then fail with a clear message."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | Literal[False] | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds.
    A probe may answer ``cond and value``: what it returns once true is typed ``value``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except AssertionError as e:  # a probe may assert to explain what it saw
            value, last = None, e
        if value:
            return value
        if value is not None:
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.1f}s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval)
