"""Where the stream server, the idle loop and the sync meet over a sandbox's use.

Three loops judge whether a sandbox is in use: the stream server admits streams
into it, the idle loop freezes or suspends it when quiet, the sync pauses and
suspends it when its spec asks. ``policy.lifecycle`` names where they meet
(``STEPS``: a thaw for use takes the idle lock; a suspension waits for no stream
in the slots), and this is that place, built before any of them so each is handed
it whole: the stream slots under one lock (``policy.streamslots``), the lock that
freezes and thaws for use take, and which sandboxes are due for an idle
suspension or waited for by a use (``agent.idlewake``). The end of a stream, or a
use waiting, wakes the sync.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sandlot.agent.idlewake import IdleSuspends
from sandlot.policy.streamslots import (
    Admission,
    StreamSlots,
    admit,
    begin_suspension,
    end_suspension,
    release,
)

MAX_SESSIONS = 512  # the default of the stream_max_sessions setting


class SandboxUses:
    """The node's streams, as the loops that freeze and suspend sandboxes see them."""

    def __init__(
        self,
        sandbox_of: Callable[[str], Mapping[str, Any] | None] = lambda _key: None,
        wake_sync: Callable[[], None] = lambda: None,
        *,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.max_sessions = max_sessions
        self.wake_sync = wake_sync
        # The admitted connections, until each ends, and the sandboxes being suspended:
        # one state under one lock (``policy.streamslots``).
        self._slots = StreamSlots(limit=max_sessions)
        self._lock = threading.Lock()
        # An idle freeze and a thaw for use hold it: a stream admitted meanwhile is
        # never frozen under it, and a spec's pause never lands on a thaw's heels.
        self.thaws = threading.Lock()
        self.suspends = IdleSuspends(sandbox_of, wake_sync)

    def sessions(self, key: str) -> int:
        """Exec, files and port-forward sessions open into sandbox ``key``."""
        with self._lock:
            return self._slots.sessions(key)

    def in_use(self) -> frozenset[str]:
        """The sandboxes with an exec, files or port-forward session open."""
        with self._lock:
            return self._slots.in_use()

    def slots(self) -> StreamSlots:
        """The node's stream slots as they are now."""
        with self._lock:
            return self._slots

    @contextlib.contextmanager
    def suspending(self, key: str) -> Iterator[bool]:
        """Whether a suspension of ``key`` may begin (no stream uses it); while it runs,
        no stream into it is admitted."""
        with self._lock:
            self._slots, begun = begin_suspension(self._slots, key)
        try:
            yield begun
        finally:
            if begun:
                with self._lock:
                    self._slots = end_suspension(self._slots, key)

    def admit(self, connection: int, used: str | None) -> Admission:
        """A slot for ``connection`` (into sandbox ``used``; None: a log)."""
        with self._lock:
            self._slots, admission = admit(self._slots, connection, used)
        return admission

    def hold(self, connection: int, serving: Callable[[], None]) -> bool:
        """Whether ``connection`` still has its slot; if so, ``serving`` marks it served
        under the slots' lock (its end, not its socket's, frees the slot from then)."""
        with self._lock:
            if connection not in self._slots.used:
                return False
            serving()
            return True

    def release(self, connection: int, unless: Callable[[], bool] = lambda: False) -> None:
        """Free ``connection``'s slot (not while ``unless``, judged under the lock); the
        end of a stream into a sandbox wakes the sync (a pause held for it is due)."""
        with self._lock:
            if unless():
                return
            self._slots, used = release(self._slots, connection)
        if used is not None:
            self.wake_sync()


__all__ = ["MAX_SESSIONS", "SandboxUses"]
