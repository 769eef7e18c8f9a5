"""The agent's threads: loops that run a step, and the pool that runs sandbox work.

- ``spawn``: a step every ``interval`` (the reaper, the image collector).
- ``spawn_due``: a step again after the seconds it returns, at most ``interval``
  (the ephemeral-storage pass, which re-measures a growing sandbox sooner).
- ``spawn_woken``: a step when woken by a watch (the sync, CachePrune answers),
  paced by ``policy.syncpacing``: a lone change runs a pass at once, a burst
  shares passes at a bounded rate, and a pass runs at least once per ``longest``.
- ``WorkPool``: sandbox work on a bounded pool, at most one item per key in flight;
  the end of an item wakes the sync (a pass skipped that key meanwhile, or the work
  may need a follow-up), unless the item answers ``SETTLED`` (it did and recorded
  all it was handed) and no pass looked at its key while it ran
  (``policy.syncpacing.wake_after``).

A step that raises is logged and the loop goes on; nothing here ever stops a loop
but the stop event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sandlot.policy import syncpacing
from sandlot.policy.syncpacing import Pacing, wake_after

log = logging.getLogger(__name__)

SETTLED = object()
"""A work item's answer: it did all it was handed and recorded it, so its end needs
no pass (one still runs if a pass skipped its key meanwhile)."""


class Loops:
    """The agent's loop threads, all ended by one stop event."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.threads: list[threading.Thread] = []

    def _start(self, name: str, loop: Callable[[], None]) -> None:
        thread = threading.Thread(target=loop, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def spawn(self, name: str, step: Callable[[], object], interval: float) -> None:
        def loop() -> None:
            while not self.stop.is_set():
                try:
                    step()
                except Exception:
                    log.exception("%s pass failed", name)
                if self.stop.wait(interval):
                    return

        self._start(name, loop)

    def spawn_due(self, name: str, step: Callable[[], float], interval: float) -> None:
        """Run ``step`` again after the seconds it returns (at most ``interval``); a
        step that fails runs again one ``interval`` later."""

        def loop() -> None:
            while not self.stop.is_set():
                wait = interval
                try:
                    wait = min(max(step(), 0.0), interval)
                except Exception:
                    log.exception("%s pass failed", name)
                if self.stop.wait(wait):
                    return

        self._start(name, loop)

    def spawn_woken(
        self,
        name: str,
        step: Callable[[], object],
        wake: threading.Event,
        pacing: Pacing,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Run ``step`` when ``wake`` is set, as ``policy.syncpacing`` allows: at once
        while its bucket holds a pass, at least once per ``pacing.longest``. A pass
        that fails runs again one ``pacing.interval`` later."""

        def loop() -> None:
            budget = syncpacing.full_budget(pacing, clock())
            while not self.stop.is_set():
                now = clock()
                woken = wake.is_set()
                due = syncpacing.next_pass_at(budget, pacing, now, woken=woken)
                if due > now:
                    # Woken: only a stop ends the wait early. Idle: a wake-up does too.
                    (self.stop if woken else wake).wait(due - now)
                    continue
                # Cleared before the pass: a change arriving during it wakes the next.
                wake.clear()
                budget = syncpacing.take_pass(budget, pacing, now)
                try:
                    step()
                except Exception:
                    log.exception("%s pass failed", name)
                    budget = syncpacing.fail_pass(budget, clock())
                    wake.set()

        self._start(name, loop)

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout=timeout)


class WorkPool:
    """Sandbox work on ``workers`` threads, one item per key at a time."""

    def __init__(self, workers: int, stop: threading.Event, done: threading.Event) -> None:
        self._stop = stop
        self._done = done
        self._busy: set[str] = set()
        self._looked: set[str] = set()  # busy keys a pass (or a hand-over) planned around
        # Versions of a busy key's Sandbox the watch brought while its work ran, and
        # those its work wrote itself: any other is a change its end must wake a pass for.
        self._changed: dict[str, set[str]] = {}
        self._own: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._running = threading.local()  # the key whose work this pool thread runs
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox")
        # Told each key whose work ended, once it may take new work; True asks for a pass.
        self.ended: Callable[[str], object] = lambda _key: None

    def in_flight(self) -> frozenset[str]:
        """The keys with work running now (a snapshot), for a plan that leaves them
        alone: each is noted as looked at, so its end wakes a pass that sees it."""
        with self._lock:
            self._looked |= self._busy
            return frozenset(self._busy)

    def busy(self, key: str) -> bool:
        with self._lock:
            return key in self._busy

    def note_change(self, key: str, version: str) -> bool:
        """Hold a change of ``key``'s Sandbox (its new ``version``) for the end of the
        work running for it, instead of a pass now that would skip the key; False
        (nothing held) when no work runs for it."""
        with self._lock:
            if key not in self._busy:
                return False
            self._changed.setdefault(key, set()).add(version)
            return True

    def note_own(self, key: str, version: str) -> None:
        """``version`` of ``key``'s Sandbox is a write of the work running for it."""
        with self._lock:
            if key in self._busy:
                self._own.setdefault(key, set()).add(version)

    def running_here(self, key: str) -> bool:
        """Whether the calling thread is running ``key``'s submitted work (a status
        write it makes is then seen by its listeners on this thread)."""
        return getattr(self._running, "key", None) == key

    def take(self, key: str) -> bool:
        """Hold ``key``'s slot for the caller's own thread (a loop acting in place);
        False when it has work in flight or the agent stops. ``let_go`` ends it."""
        with self._lock:
            if key in self._busy or self._stop.is_set():
                return False
            self._busy.add(key)
            return True

    def let_go(self, key: str, *, settled: bool = False) -> None:
        """End a hold (``take``'s, or a submitted work's): the key may take work again,
        and a pass looks again (what the work did, or failed to do, may need a
        follow-up), unless the work ``settled`` everything and no pass skipped the
        key meanwhile, nor a change other than the work's own writes was held for
        its end (``wake_after``)."""
        with self._lock:
            self._busy.discard(key)
            looked = key in self._looked
            self._looked.discard(key)
            foreign = self._changed.pop(key, set()) - self._own.pop(key, set())
        asked = False
        try:
            asked = self.ended(key) is True
        except Exception:
            log.exception("sandbox %s: the end of its work was not handled", key)
            asked = True
        if wake_after(settled=settled, looked=looked or bool(foreign), asked=asked):
            self._done.set()

    def submit(self, key: str, work: Callable[[], object]) -> bool:
        """Run ``work`` unless ``key`` already has work in flight or the agent stops."""
        if not self.take(key):
            return False

        def run() -> None:
            settled = False
            self._running.key = key
            try:
                settled = work() is SETTLED
            except Exception:
                log.exception("sandbox %s: work failed", key)
            finally:
                self._running.key = None
                self.let_go(key, settled=settled)

        try:
            self._pool.submit(run)
        except RuntimeError:  # pool shut down
            with self._lock:
                self._busy.discard(key)
            return False
        return True

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["SETTLED", "Loops", "WorkPool"]
