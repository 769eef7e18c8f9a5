"""Carries an informer's events from its thread to the event loop.

An informer (``adapters.informer``: every Sandbox, every SandboxClaim) reads its one
watch on a thread; the cache it feeds and its listeners live on the event loop.
Events cross in batches: the first event of a burst schedules one loop callback,
which takes every event queued by then, so a marking pass's thousand MODIFIED
events, or a burst of a thousand claims, cost the loop a few callbacks, not a
thousand. The queue is bounded: at start-up the informer lists faster than the
loop takes records, and its thread waits rather than holding tens of thousands of
parsed bodies (the start-up peak RSS).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

RawListener = Callable[[str, Mapping[str, Any]], None]  # (event type, body), on the loop

MAX_QUEUED = 2048  # events the informer may be ahead of the loop
BATCH = 512  # events one loop callback takes before it lets the loop run others
WAIT_SLICE = 1.0  # seconds between checks that the feed is still open, when full
LISTED = "LISTED"


class FeedSink(Protocol):
    """What a feed delivers to, on the loop: the sandbox cache, the claim controller."""

    def on_event(self, event_type: str, body: Mapping[str, Any]) -> None: ...

    def retain(self, keys: set[str]) -> None:
        """A complete list held exactly ``keys`` ("namespace/name")."""


class EventFeed:
    def __init__(
        self,
        cache: FeedSink,
        loop: asyncio.AbstractEventLoop,
        listeners: Sequence[RawListener] = (),
        *,
        name: str = "sandbox",
        max_queued: int = MAX_QUEUED,
    ) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.cache = cache
        self.name = name
        self.loop = loop
        self.listeners = list(listeners)
        self.max_queued = max_queued
        self._queued: deque[tuple[str, Any]] = deque()
        self._room = threading.Condition()
        self._scheduled = False
        self._closed = False

    # -- the informer's thread --------------------------------------------------------

    def on_event(self, event_type: str, body: Mapping[str, Any]) -> None:
        self._put(event_type, body)

    def on_listed(self, keys: set[str]) -> None:
        """A complete list held exactly ``keys``: whatever else the cache holds was
        deleted while no watch was there to say so."""
        self._put(LISTED, keys)

    def close(self) -> None:
        """Drop what is queued and release a waiting informer (the operator stops)."""
        with self._room:
            self._closed = True
            self._queued.clear()
            self._room.notify_all()

    def _put(self, event_type: str, payload: Any) -> None:
        with self._room:
            while len(self._queued) >= self.max_queued and not self._closed:
                self._room.wait(WAIT_SLICE)  # the loop drains; close() releases
            if self._closed:
                return
            self._queued.append((event_type, payload))
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    # -- the event loop ---------------------------------------------------------------

    def _drain(self) -> None:
        with self._room:
            batch = [self._queued.popleft() for _ in range(min(BATCH, len(self._queued)))]
            more = bool(self._queued)
            self._scheduled = more
            self._room.notify_all()
        if more:
            self.loop.call_soon(self._drain)  # after whatever else is ready
        for event_type, payload in batch:
            try:
                if event_type == LISTED:
                    self.cache.retain(payload)
                    continue
                self.cache.on_event(event_type, payload)
                for listener in self.listeners:
                    listener(event_type, payload)
            except Exception:
                log.exception("%s event %s not taken", self.name, event_type)
