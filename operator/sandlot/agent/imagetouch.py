"""Which images sandboxes are starting from, for the collector's last look before a delete.

A start writes the image's last-used label before it creates the container, so
every pass that lists images afterwards sees it too young (``minAge``) to go. A
pass that listed them before the label was written still holds the old label in
its plan; it asks here before each delete and keeps an image a start touched
after the pass began, or is touching now. Touches older than a pass's beginning
are forgotten at its end: their labels were in place for that listing and for
every later one. The log is therefore bounded by the starts of one pass.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TouchLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._touched: dict[str, int | None] = {}  # name -> touch count; None: under way

    def mark(self) -> int:
        """Taken by a pass before it lists anything."""
        with self._lock:
            return self._count

    @contextmanager
    def touching(self, name: str) -> Iterator[None]:
        """Around the label write of a start (whatever its outcome)."""
        with self._lock:
            self._touched[name] = None
        try:
            yield
        finally:
            with self._lock:
                self._count += 1
                self._touched[name] = self._count

    def since(self, name: str, mark: int) -> bool:
        """``name`` was touched after ``mark`` was taken, or is being touched now."""
        with self._lock:
            count = self._touched.get(name, 0)
            return count is None or count > mark

    def forget(self, mark: int) -> None:
        with self._lock:
            self._touched = {n: c for n, c in self._touched.items() if c is None or c > mark}


__all__ = ["TouchLog"]
