"""One keyed work queue for every controller, after client-go's rate-limited
delaying queue (the one controller-runtime gives each reconciler).

A controller is ``async def reconcile(key) -> float | None``: it reads its
caches, applies what its pure policy decides, and answers how many seconds from
now it wants to look at the key again (None: only when something changes). The
queue owns everything around that, so no controller repeats it:

- a key is queued at most once, however often it is added;
- a key is never reconciled twice at once: added while it runs, it runs once
  more after, with whatever changed meanwhile;
- ``add_after`` keeps, per key, the earliest deadline asked for and keeps it
  exactly, so a grace period's end wakes the key at that moment, not on the next
  tick, and a short retry is never pushed back by a later deadline;
- a reconcile that raises is retried after a per-key exponential backoff,
  reset by the key's next success;
- work that comes due while this replica is not the leader is dropped: a new
  leader adds everything again from its warm caches;
- ``held`` (or ``hold`` and ``release``) defers what another controller's urgent
  writes set off for a key until they are done (a given time at most): it then
  runs once;
- ``rest`` (seconds; 0 by default) spaces a key's runs: one added within ``rest``
  of its last run's end starts then, once, with everything added meanwhile. For a
  controller whose pass costs in proportion to what it holds and whose events
  come in storms (a pool of a thousand members during a burst of claims): its
  passes then take a bounded share of the process, not all of it;
- watch threads hand work over with ``add_threadsafe`` / ``call_threadsafe``.

Time comes from an injected ``clock`` (monotonic seconds). Deadlines wait in a
heap ordered by due time, behind one loop timer armed for the first of them.
Idle workers wait each on its own future, and a key made ready wakes one of
them: a queue with 16 workers costs one wake-up per key, not 16 (each of which
also armed and cancelled a timer of its own). Tests drive the same code with a
fake clock: advance it, then ``await run_until_idle()``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sandlot.policy.backoff import capped_doubling

log = logging.getLogger(__name__)

Reconcile = Callable[[str], Awaitable[float | None]]


def earliest(*delays: float | None) -> float | None:
    """The soonest of several requeue delays a reconcile has (None: no requeue)."""
    given = [d for d in delays if d is not None]
    return min(given) if given else None


class WorkQueue:
    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        backoff_start: float = 1.0,
        backoff_cap: float = 60.0,
        observe: Callable[[float], None] | None = None,
        rest: float = 0.0,
    ) -> None:
        if rest < 0:
            raise ValueError(f"rest must be >= 0 seconds, got {rest}")
        if not 0 < backoff_start <= backoff_cap:
            raise ValueError(
                f"backoff_start must be > 0 and <= backoff_cap, got {backoff_start} > {backoff_cap}"
            )
        self.name = name
        self.reconcile = reconcile
        self.is_leader = is_leader
        self.clock = clock
        self.backoff_start = backoff_start
        self.backoff_cap = backoff_cap
        self.observe = observe
        self.rest = rest
        self._resting: dict[str, float] = {}  # key -> when its rest after a run ends
        self._ready: deque[str] = deque()
        self._queued: set[str] = set()  # in _ready, or waiting for its run to finish
        self._processing: set[str] = set()
        self._due: dict[str, float] = {}  # key -> earliest deadline asked for
        self._heap: list[tuple[float, int, str]] = []  # entries not in _due are stale
        self._seq = itertools.count()
        self._failures: dict[str, int] = {}
        self._holds: dict[str, dict[int, float]] = {}  # key -> {hold: its limit}
        self._idle: deque[asyncio.Future[None]] = deque()  # workers waiting for a key
        self._timer: asyncio.TimerHandle | None = None  # armed for the first deadline
        self._timer_at: float | None = None
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.wakeups = 0  # idle workers woken (one per key made ready while they wait)

    # -- adding work ---------------------------------------------------------------

    def add(self, key: str) -> None:
        """Queue ``key`` now (once, however often it is added), or when its rest ends."""
        if key in self._queued:
            return
        if (until := self._resting.get(key)) is not None:
            if until > self.clock():
                self.add_after(key, until - self.clock())
                return
            del self._resting[key]
        self._queued.add(key)
        self._make_ready(key)

    def _make_ready(self, key: str) -> None:
        """Queued ``key`` may start now, unless it runs or is held (they requeue it)."""
        if key not in self._processing and key not in self._holds:
            self._ready.append(key)
            self._wake_one()

    def _wake_one(self) -> None:
        """Hand the news of a ready key to one idle worker (a busy one finds it when
        its run ends: a worker looks for work before it waits)."""
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def add_all(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.add(key)

    def add_after(self, key: str, delay: float) -> None:
        """Queue ``key`` ``delay`` seconds from now, unless it is due earlier already."""
        if delay <= 0:
            self.add(key)
            return
        due = self.clock() + delay
        current = self._due.get(key)
        if current is not None and current <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._arm(due)

    def forget(self, key: str) -> None:
        """The key's object is gone: drop its pending deadline and its backoff."""
        self._due.pop(key, None)
        self._failures.pop(key, None)
        self._resting.pop(key, None)

    @contextmanager
    def held(self, key: str, limit: float) -> Iterator[None]:
        """Defer what the block sets off for ``key`` until it ends, ``limit`` seconds
        at most: adds meanwhile are kept and start once the last hold ends or expires
        (its limit wakes the queue like ``add_after``).

        A run already under way goes on, and so does a key already waiting to start:
        back-to-back holds never starve it.
        """
        hold = self.hold(key, limit)
        try:
            yield
        finally:
            self.release(key, hold)

    def hold(self, key: str, limit: float) -> int:
        """Defer ``key`` until ``release(key, hold)`` or ``limit`` seconds, whichever
        comes first (``held`` for a hold that outlives one block)."""
        hold = next(self._seq)
        until = self.clock() + limit
        self._holds.setdefault(key, {})[hold] = until
        self._arm(until)  # the queue wakes at the limit
        return hold

    def release(self, key: str, hold: int) -> None:
        """End ``hold`` (one that expired already, or was released, is ignored)."""
        holds = self._holds.get(key)
        if holds is None or holds.pop(hold, None) is None or holds:
            return
        del self._holds[key]
        if key in self._queued and key not in self._ready:  # it may have waited already
            self._make_ready(key)

    def is_held(self, key: str) -> bool:
        return key in self._holds

    def _expire_holds(self) -> float | None:
        """Release the holds past their limit; returns the next limit, if any."""
        now = self.clock()
        for key, holds in list(self._holds.items()):
            for hold, until in list(holds.items()):
                if until <= now:
                    log.warning("%s %s: held past its limit; released", self.name, key)
                    self.release(key, hold)
        return min((u for holds in self._holds.values() for u in holds.values()), default=None)

    # -- from other threads ----------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def call_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the queue's loop (directly when no loop is bound yet)."""
        if self._loop is None:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def add_threadsafe(self, key: str) -> None:
        self.call_threadsafe(self.add, key)

    # -- state, for the controllers' metrics and tests --------------------------------

    def __len__(self) -> int:
        return len(self._ready)

    def due_at(self, key: str) -> float | None:
        """The pending deadline of ``key`` (clock seconds), if any."""
        return self._due.get(key)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def backoff(self, failures: int) -> float:
        """The delay before retry number ``failures`` (1, 2, ...): doubling, capped."""
        return capped_doubling(failures, self.backoff_start, self.backoff_cap)

    # -- running ---------------------------------------------------------------------

    def _promote_due(self) -> float | None:
        """Move due deadlines to the ready queue; returns the next future one (a
        deadline or a hold's limit)."""
        next_limit = self._expire_holds() if self._holds else None
        now = self.clock()
        while self._heap:
            due, _, key = self._heap[0]
            if self._due.get(key) != due:
                heapq.heappop(self._heap)  # replaced by an earlier one, or forgotten
                continue
            if due > now:
                return earliest(due, next_limit)
            heapq.heappop(self._heap)
            del self._due[key]
            self.add(key)
        return next_limit

    def _take(self) -> str | None:
        if not self._ready:
            return None
        key = self._ready.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    # -- the timer -------------------------------------------------------------------

    def _arm(self, at: float) -> None:
        """Make sure the running queue wakes by ``at`` (clock seconds)."""
        if self._running and (self._timer_at is None or at < self._timer_at):
            self._set_timer(at)

    def _set_timer(self, at: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at is not None and self._loop is not None:
            self._timer = self._loop.call_later(max(at - self.clock(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        """A deadline or a hold's limit is due: its keys become ready (each wakes a
        worker), and the timer is armed again for the next one."""
        self._timer, self._timer_at = None, None
        self._set_timer(self._promote_due())

    async def _process(self, key: str) -> None:
        started: float | None = None
        try:
            if not self.is_leader():
                return  # a standby drops work; the next leader adds everything again
            started = time.perf_counter()
            try:
                requeue_after = await self.reconcile(key)
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self.backoff(failures)
                log.exception("%s %s: reconcile failed; retrying in %.1fs", self.name, key, delay)
                self.add_after(key, delay)
                return
            self._failures.pop(key, None)
            if requeue_after is not None:
                self.add_after(key, requeue_after)
        finally:
            self._processing.discard(key)
            if self.rest > 0:
                self._resting[key] = self.clock() + self.rest
                if key in self._queued:  # added while it ran: once more, after its rest
                    self._queued.discard(key)
                    self.add(key)
            elif key in self._queued:
                self._make_ready(key)  # added while it ran: once more, now
            if self.observe is not None and started is not None:
                self.observe(time.perf_counter() - started)

    async def run_until_idle(self) -> list[str]:
        """Reconcile every key due by the clock's now, one at a time; the keys taken,
        in order (a test asserting that a pass changed nothing first shows it ran).

        The step a test takes after moving its fake clock; keys a reconcile asks to
        see again later stay in the heap. Keys already running elsewhere wait.
        """
        done: list[str] = []
        self._promote_due()
        while (key := self._take()) is not None:
            await self._process(key)
            done.append(key)
            self._promote_due()
        return done

    async def run(self, workers: int = 1) -> None:
        """Reconcile forever, ``workers`` keys at a time (never one key twice at once)."""
        self.bind_loop(asyncio.get_running_loop())
        self._running = True
        self._on_timer()  # what came due before the run, and the first deadline's timer
        tasks = [
            asyncio.create_task(self._worker(), name=f"{self.name}-{i}") for i in range(workers)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            self._running = False
            self._set_timer(None)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = self._take()
            if key is not None:
                await self._process(key)
                continue
            waiter: asyncio.Future[None] = loop.create_future()
            self._idle.append(waiter)  # a cancelled waiter is skipped by ``_wake_one``
            await waiter
            self.wakeups += 1
