"""Idle suspension (``spec.idleAction: Suspend``) and start-again on use, coordinated.

The idle loop finds a sandbox quiet past its timeout and marks it due; the next
sync pass turns that into an ``idle-suspend`` action, done in the sandbox's work
slot by ``agent.suspend.Suspensions`` as any suspend (freeze, commit, record,
remove), its condition saying ``Idle``. The spec still asks for Running, so the
sync holds it suspended (``policy.idle.effective_mode``) until a use wakes it: an
exec, files call or port-forward waits here while the sync restores it, then is
served by its new container; a claim of a pool member wakes it without waiting.

A use arriving while a suspension is due cancels it, and a suspension begins
only with no use waiting; whether a stream is open is the stream slots' to
answer, with their admissions, under one lock (``agent.uses``), so a
stream is never cut by a suspension it raced with and a write never lands beside
its commit. A use waits within its admission's bound and not past its
connection's end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from sandlot.api.common import key_of
from sandlot.policy.idle import woken_outcome

log = logging.getLogger(__name__)

GONE_POLL = 0.5
"""Seconds between two looks at whether a waiting use's connection ended."""


class IdleSuspends:
    """Which sandboxes are due for an idle suspension and which a use waits to wake."""

    def __init__(
        self,
        sandbox_of: Callable[[str], Mapping[str, Any] | None],
        wake_sync: Callable[[], None] = lambda: None,
    ) -> None:
        self.sandbox_of = sandbox_of
        self.wake_sync = wake_sync
        self._due: set[str] = set()
        self._refused: set[str] = set()  # a commit refused (a user-namespace sandbox): pause
        self._waking: Counter[str] = Counter()  # uses waiting, by key
        self._claimed: set[str] = set()  # claims that woke one, until it runs
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    # -- the idle loop

    def request(self, key: str) -> bool:
        """Mark ``key`` due for an idle suspension; False when its commits are refused
        (it is paused instead) or a use waits for it."""
        with self._lock:
            if key in self._refused or self._waking[key] or key in self._claimed:
                return False
            self._due.add(key)
        self.wake_sync()
        return True

    def forget(self, keys: set[str], still_suspended: set[str]) -> None:
        """Keep only what is known of ``keys`` (the sandboxes still on the node); a
        claim's wake is over once its sandbox is not idle-suspended any more."""
        with self._lock:
            self._due &= keys
            self._refused &= keys
            self._claimed &= still_suspended

    # -- the sync

    def flags(self) -> tuple[frozenset[str], frozenset[str]]:
        """(due for an idle suspension, waited for by a use), for the sync's plan."""
        with self._lock:
            waking = {k for k, n in self._waking.items() if n} | self._claimed
            return frozenset(self._due), frozenset(waking)

    def waking(self, key: str) -> bool:
        with self._lock:
            return self._waking[key] > 0 or key in self._claimed

    # -- the suspension, in the sandbox's work slot

    def begin(self, key: str) -> bool:
        """Whether the idle suspension of ``key`` may start now as far as the idle
        loop knows: still due and no use waiting (no stream open is the stream
        server's to say). Not due any more either way."""
        with self._lock:
            woken = self._waking[key] or key in self._claimed
            ok = key in self._due and not woken
            self._due.discard(key)
            return ok

    def refused(self, key: str) -> None:
        """Its commit was refused: the idle loop pauses it from now on."""
        with self._lock:
            self._refused.add(key)

    def is_refused(self, key: str) -> bool:
        with self._lock:
            return key in self._refused

    # -- a use

    def changed(self) -> None:
        """The sandbox watch changed: waiters look again."""
        with self._changed:
            self._changed.notify_all()

    def wake_for_use(
        self,
        sb: Mapping[str, Any],
        kind: str,
        timeout: float,
        gone: Callable[[], bool] = lambda: False,
    ) -> str | None:
        """Have the sync start ``sb`` again and wait for it to run, ``timeout`` seconds
        at most and not once ``gone`` says the stream's connection ended; None once it
        runs, else why not (the stream is refused with it). The use is waiting no
        more when this returns, whatever ended the wait."""
        key, uid = key_of(sb), str((sb.get("metadata") or {}).get("uid") or "")
        with self._lock:
            self._waking[key] += 1
            self._due.discard(key)
        self.wake_sync()
        deadline = time.monotonic() + timeout
        outcome: str | None = None
        try:
            with self._changed:
                while (outcome := woken_outcome(self.sandbox_of(key), uid)) is None:
                    left = deadline - time.monotonic()
                    if left <= 0 or gone():
                        break
                    self._changed.wait(min(left, GONE_POLL))
        finally:
            with self._lock:
                self._waking[key] -= 1
                if not self._waking[key]:
                    del self._waking[key]
        if outcome == "running":
            log.info("sandbox %s: started again for %s after an idle suspension", key, kind)
            return None
        if outcome is None and gone():
            log.info("sandbox %s: the %s waiting for it to start again went away", key, kind)
            return f"sandbox {key} was suspended for being idle and the {kind} went away"
        if outcome is None:
            return f"sandbox {key} was suspended for being idle and did not start again within {timeout:g}s for {kind}; try again"
        return f"sandbox {key} was suspended for being idle and cannot start again for {kind}: {outcome}"

    def wake_for_claim(self, sb: Mapping[str, Any]) -> None:
        """A claim bound an idle-suspended member: start it again, waiting for nothing."""
        with self._lock:
            self._claimed.add(key_of(sb))
            self._due.discard(key_of(sb))
        self.wake_sync()


__all__ = ["GONE_POLL", "IdleSuspends"]
