"""One deadline shared by the steps of one bounded operation.

A containerd method makes several RPCs, a CNI command runs a chain of plugins;
each step gets what is left of the operation's budget, never a fresh one, so the
operation as a whole keeps its bound. The adapter names the exception it raises
when the time is up (``RuntimeTimeout``, ``CniTimeout``), so callers keep
catching their own adapter's error.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    """``seconds`` from construction; ``remaining(step)`` raises once they have passed."""

    def __init__(
        self, seconds: float, *, what: str = "", expired: Callable[[str], Exception]
    ) -> None:
        self.seconds = seconds
        self.what = what
        self._expired = expired
        self._at = time.monotonic() + seconds

    def remaining(self, step: str) -> float:
        """Seconds left for ``step``; raises ``expired(message)`` when none are."""
        left = self._at - time.monotonic()
        if left <= 0:
            prefix = f"{self.what}: " if self.what else ""
            raise self._expired(f"{prefix}{step}: deadline of {self.seconds:g}s passed")
        return left


__all__ = ["Deadline"]
