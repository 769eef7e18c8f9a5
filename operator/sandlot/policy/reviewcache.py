"""Allowed access-review answers, remembered a few seconds. Pure: time is passed in.

The stream gateway asks the API server a SubjectAccessReview for every stream; a
program running commands one after another asks the same question each time. An
allow is kept ``ttl`` seconds, counted from when the question was sent, for exactly
that question (user, groups, extra, uid and every resource attribute: the key is
the whole review spec), so a permission revoked is honoured at most ``ttl`` late;
a denial, an error and an answer carrying an evaluation error are never kept, so a
permission granted is honoured at once. Entries expire in the order they were
stored, so the oldest goes first when the bound is reached.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def review_key(spec: Mapping[str, Any]) -> str:
    """The whole review spec as one canonical string: two questions share an answer
    only when they ask the same thing of the same caller."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def keepable(status: Mapping[str, Any]) -> bool:
    """Only a clean allow may be remembered."""
    return (
        status.get("allowed") is True
        and not status.get("denied")
        and not status.get("evaluationError")
    )


def fresh(asked_at: float, now: float, ttl: float) -> bool:
    """Whether an answer to a question sent at ``asked_at`` still stands at ``now``."""
    return ttl > 0 and asked_at <= now < asked_at + ttl


@dataclass
class ReviewCache:
    """At most ``max_entries`` allows, each standing ``ttl`` seconds (0: none kept)."""

    ttl: float
    max_entries: int
    _entries: OrderedDict[str, tuple[float, Mapping[str, Any]]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.ttl < 0:
            raise ValueError(f"ttl must not be negative, got {self.ttl}")
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {self.max_entries}")

    def __len__(self) -> int:
        return len(self._entries)

    def answer(self, key: str, now: float) -> Mapping[str, Any] | None:
        """The remembered allow for ``key`` if it is fresh at ``now``, else None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if fresh(entry[0], now, self.ttl):
            return entry[1]
        del self._entries[key]
        return None

    def remember(self, key: str, status: Mapping[str, Any], asked_at: float) -> None:
        """Keep ``status`` for ``key`` if it is a clean allow; anything else forgets
        what was kept for ``key``. Expired entries and, past the bound, the oldest go."""
        self._entries.pop(key, None)
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if fresh(oldest[0], asked_at, self.ttl):
                break
            self._entries.popitem(last=False)
        if self.ttl <= 0 or not keepable(status):
            return
        self._entries[key] = (asked_at, dict(status))
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


__all__ = ["ReviewCache", "fresh", "keepable", "review_key"]
