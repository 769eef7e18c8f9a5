"""Two pools for sandbox work, one key at a time across both.

Starts, fences, cleanups and reaps are bounded (every containerd call has a
deadline) and share the ``teardown_concurrency`` pool. A graceful stop is not: it
waits out the sandbox's ``terminationGracePeriodSeconds``, up to an hour. Run on
the same pool, a handful of sandboxes ignoring SIGTERM would hold every worker for
that long, and no start or fence could run on the node meanwhile. So graceful
stops run on a pool of their own, sized by the node's capacity (every sandbox it
holds may be draining at once); their threads mostly wait on a task's exit.

A key never has work in both pools at once: the check and the submit happen under
one lock, and every submit of the agent goes through here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sandlot.agent.loops import WorkPool


class SandboxPools:
    """The bounded pool and the graceful-stop pool, seen as one ``WorkPool``."""

    def __init__(
        self,
        workers: int,
        stop_workers: int,
        stop: threading.Event,
        done: threading.Event,
    ) -> None:
        self.bounded = WorkPool(workers, stop, done)
        self.graceful = WorkPool(max(1, stop_workers), stop, done)
        self._lock = threading.Lock()
        self._stop = stop
        self._done = done

    def wake_in(self, seconds: float) -> None:
        """Wake the sync in ``seconds`` (work that waits out a back-off is due then),
        unless the agent is stopping by then."""

        def wake() -> None:
            if not self._stop.is_set():
                self._done.set()

        timer = threading.Timer(max(0.0, seconds), wake)
        timer.daemon = True
        timer.start()

    def in_flight(self) -> frozenset[str]:
        return self.bounded.in_flight() | self.graceful.in_flight()

    def tell_ended(self, ended: Callable[[str], object]) -> None:
        """Call ``ended`` with each key whose work ends, once it may take new work (True
        from it asks for a pass)."""
        self.bounded.ended = self.graceful.ended = ended

    def busy(self, key: str) -> bool:
        return self.bounded.busy(key) or self.graceful.busy(key)

    def running_here(self, key: str) -> bool:
        """Whether the calling thread runs ``key``'s submitted work."""
        return self.bounded.running_here(key) or self.graceful.running_here(key)

    def note_change(self, key: str, version: str) -> bool:
        """Hold a change of ``key``'s Sandbox for the end of its running work (either
        pool's); False when none runs."""
        return self.bounded.note_change(key, version) or self.graceful.note_change(key, version)

    def note_own(self, key: str, version: str) -> None:
        self.bounded.note_own(key, version)
        self.graceful.note_own(key, version)

    def submit(self, key: str, work: Callable[[], object], *, graceful: bool = False) -> bool:
        """Run ``work`` on the pool it belongs to, unless ``key`` has work in either."""
        target, other = (self.graceful, self.bounded) if graceful else (self.bounded, self.graceful)
        with self._lock:
            if other.busy(key):
                return False
            return target.submit(key, work)

    @contextmanager
    def holding(self, key: str) -> Iterator[bool]:
        """Hold ``key``'s slot while the block runs in place (the idle loop's freeze),
        as a submitted work item would: yields False, holding nothing, when the key
        has work in either pool (a stop, a commit, a snapshot under way)."""
        with self._lock:
            held = not self.graceful.busy(key) and self.bounded.take(key)
        try:
            yield held
        finally:
            if held:
                self.bounded.let_go(key)

    def shutdown(self) -> None:
        # Graceful stops see the stop event within a slice of their wait and let go.
        self.graceful.shutdown()
        self.bounded.shutdown()


__all__ = ["SandboxPools"]
