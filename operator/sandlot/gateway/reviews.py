"""The gateway's access reviews, with the fresh allows of ``policy.reviewcache`` in
front: a program running commands one after another is reviewed once per
``review_cache_ttl``, not once per command; every other question is asked."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sandlot.policy.reviewcache import ReviewCache, review_key

CACHE = "cache"
API = "api"


class CachedReviews:
    """``review(spec) -> status``, answered from a fresh allow for exactly ``spec`` if
    one is kept, else asked (a failure raises as ``review``'s does, and keeps nothing).
    ``on_answer`` hears where each answer came from (``cache`` or ``api``)."""

    def __init__(
        self,
        review: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        *,
        ttl: float,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
        on_answer: Callable[[str], None] = lambda source: None,
    ) -> None:
        self._review = review
        self._cache = ReviewCache(ttl, max_entries)
        self._clock = clock
        self._on_answer = on_answer
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def __call__(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        key = review_key(spec)
        asked_at = self._clock()  # before the question: the answer is at least this old
        with self._lock:
            kept = self._cache.answer(key, asked_at)
        if kept is not None:
            self._on_answer(CACHE)
            return kept
        status = self._review(spec)
        with self._lock:
            self._cache.remember(key, status, asked_at)
        self._on_answer(API)
        return status


__all__ = ["API", "CACHE", "CachedReviews"]
