"""How long the agent leaves a Sandbox alone after a status write about it failed.

Without this, a write the API server refuses (422 too large, 403 forbidden, 400)
is retried on every sync pass, each time after a full start: a hot loop against
both the API server and containerd. A refusal is permanent for the object as it
is, so the key is held while its ``resourceVersion`` is unchanged, with an
exponential back-off (``REFUSED_BASE`` doubling up to ``REFUSED_CAP``) so a refusal
that was about the API server's state (a policy since relaxed) is still retried
now and then. An edit of the object (a new resourceVersion) ends the hold at once.
A transient failure (429, 5xx, no answer, conflicts that outlasted their retries)
backs off the same way from ``TRANSIENT_BASE`` up to ``TRANSIENT_CAP``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sandlot.policy.backoff import capped_doubling

REFUSED_BASE = timedelta(seconds=10)
REFUSED_CAP = timedelta(minutes=5)
TRANSIENT_BASE = timedelta(seconds=1)
TRANSIENT_CAP = timedelta(seconds=30)


@dataclass(frozen=True)
class Hold:
    """A Sandbox the agent leaves alone until ``until`` while it is unchanged."""

    resource_version: str
    failures: int
    until: datetime


def next_hold(
    previous: Hold | None, resource_version: str, now: datetime, *, refused: bool
) -> Hold:
    """The hold after one more failed write about the object at ``resource_version``."""
    failures = previous.failures + 1 if previous is not None else 1
    if previous is not None and previous.resource_version != resource_version:
        failures = 1
    base, cap = (REFUSED_BASE, REFUSED_CAP) if refused else (TRANSIENT_BASE, TRANSIENT_CAP)
    delay = capped_doubling(failures, base, cap)
    return Hold(resource_version, failures, now + delay)


def is_held(hold: Hold | None, resource_version: str, now: datetime) -> bool:
    """True while the object is unchanged since its failed write and the delay runs."""
    return hold is not None and hold.resource_version == resource_version and now < hold.until


__all__ = [
    "REFUSED_BASE",
    "REFUSED_CAP",
    "TRANSIENT_BASE",
    "TRANSIENT_CAP",
    "Hold",
    "is_held",
    "next_hold",
]
