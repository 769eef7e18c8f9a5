"""Work some controllers run on their own, beside the work queue: per-key runs that
coalesce (CachePrune requests, SandboxSnapshots: a reconcile is a few blocking API
calls, run in a thread, and a burst of events about one object costs one run more
at most, never one per event). Their resync loops live from kopf's start-up to
its clean-up (``kopfhandlers.run_while_operating``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


class CoalescedRuns:
    """``reconcile(key)`` in a thread, one run of a key at a time: a key kicked while
    it runs runs once more after, however often it was kicked. A run that fails is
    logged on ``log`` as "<kind> <key>: reconcile failed"; the next kick (an event, a
    resync) tries again. Nothing runs while ``leading()`` is False."""

    def __init__(
        self,
        reconcile: Callable[[str], object],
        leading: Callable[[], bool],
        *,
        kind: str,
        task_prefix: str,
        log: logging.Logger,
    ) -> None:
        self._reconcile = reconcile
        self._leading = leading
        self._kind = kind
        self._task_prefix = task_prefix
        self._log = log
        self._running: set[str] = set()
        self._again: set[str] = set()

    def kick(self, key: str) -> None:
        """Reconcile ``key`` soon; coalesces while one reconcile of it runs."""
        if not self._leading():
            return
        if key in self._running:
            self._again.add(key)
            return
        self._running.add(key)
        name = f"{self._task_prefix}-{key}"
        asyncio.get_running_loop().create_task(self._drive(key), name=name)

    async def _drive(self, key: str) -> None:
        try:
            while True:
                self._again.discard(key)
                try:
                    await asyncio.to_thread(self._reconcile, key)
                except Exception as exc:
                    self._log.warning(
                        "%s %s: reconcile failed (will retry): %s", self._kind, key, exc
                    )
                if key not in self._again:
                    return
        finally:
            self._running.discard(key)


__all__ = ["CoalescedRuns"]
