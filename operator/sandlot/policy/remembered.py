"""Answers remembered for a while: each stands ``ttl`` seconds from when it was
asked for, at most ``max_entries`` of them, the oldest dropped first. Pure: time is
passed in. The gateway keeps allowed access reviews (``policy.reviewcache``) and
where a sandbox's agent is (``gateway.placements``) this way."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def fresh(asked_at: float, now: float, ttl: float) -> bool:
    """Whether an answer to a question sent at ``asked_at`` still stands at ``now``."""
    return ttl > 0 and asked_at <= now < asked_at + ttl


@dataclass
class Remembered(Generic[K, V]):
    """At most ``max_entries`` answers, each standing ``ttl`` seconds (0: none kept).
    Every answer lives the same ``ttl``, so they expire in the order they were kept."""

    ttl: float
    max_entries: int
    _entries: OrderedDict[K, tuple[float, V]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.ttl < 0:
            raise ValueError(f"ttl must not be negative, got {self.ttl}")
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {self.max_entries}")

    def __len__(self) -> int:
        return len(self._entries)

    def answer(self, key: K, now: float) -> V | None:
        """What is kept for ``key`` if it is fresh at ``now``, else None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if fresh(entry[0], now, self.ttl):
            return entry[1]
        del self._entries[key]
        return None

    def remember(self, key: K, value: V, asked_at: float) -> None:
        """Keep ``value`` for ``key``, asked for at ``asked_at``; expired entries and,
        past the bound, the oldest go."""
        self.forget(key)
        self._expire(asked_at)
        if self.ttl <= 0:
            return
        self._entries[key] = (asked_at, value)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, key: K) -> V | None:
        """Drop what is kept for ``key`` (fresh or not) and answer it; None if nothing."""
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def _expire(self, now: float) -> None:
        while self._entries:
            asked_at, _ = next(iter(self._entries.values()))
            if fresh(asked_at, now, self.ttl):
                return
            self._entries.popitem(last=False)


__all__ = ["Remembered", "fresh"]
