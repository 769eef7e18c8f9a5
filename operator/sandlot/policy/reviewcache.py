"""Allowed access-review answers, remembered a few seconds. Pure: time is passed in.

The stream gateway asks the API server a SubjectAccessReview for every stream; a
program running commands one after another asks the same question each time. An
allow is kept ``ttl`` seconds, counted from when the question was sent, for exactly
that question (user, groups, extra, uid and every resource attribute: the key is
the whole review spec), so a permission revoked is honoured at most ``ttl`` late;
a denial, an error and an answer carrying an evaluation error are never kept, so a
permission granted is honoured at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sandlot.policy.remembered import Remembered, fresh


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


class ReviewCache(Remembered[str, Mapping[str, Any]]):
    """At most ``max_entries`` allows, each standing ``ttl`` seconds (0: none kept)."""

    def remember(self, key: str, value: Mapping[str, Any], asked_at: float) -> None:
        """Keep a clean allow; anything else forgets what was kept for ``key``."""
        if keepable(value):
            super().remember(key, dict(value), asked_at)
        else:
            self.forget(key)


__all__ = ["ReviewCache", "fresh", "keepable", "review_key"]
