"""When a sandbox's lifetime ends, and what to do about it now: a pure decision.

A sandbox may carry an absolute ``spec.shutdownTime`` and a relative
``spec.activeDeadlineSeconds``, counted from its creation (the API server's
``creationTimestamp``), so a sandbox that never got a node ends too, as a Job's
deadline does. With both, the earlier wins. At the deadline, judged on the
operator's clock, a sandbox that is not terminal yet ends ``Stopped`` with reason
``DeadlineExceeded``; before it, the decision says how long to wait, so the
operator's work queue wakes the key at that second instead of polling.

``spec.shutdownPolicy`` says what the end is: ``Retain`` (the default, as
agent-sandbox) ends it ``Stopped``; ``Delete`` deletes it. A finished sandbox
with ``spec.ttlSecondsAfterFinished`` is deleted at ``status.finishedAt`` + TTL
(``after_finish``, shared with claims); one finished without ``finishedAt`` gets
it stamped first, so the TTL counts from a recorded moment. A pool member ended
by its own fault is kept: the pool's crash back-off counts it, and the pool's
history limit collects it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.api.timestamps import rfc3339


def deadline_of(
    shutdown_time: datetime | None,
    active_deadline_seconds: int | None,
    created_at: datetime,
) -> datetime | None:
    """The moment the sandbox's lifetime ends, or None when it has no lifetime."""
    candidates = []
    if shutdown_time is not None:
        candidates.append(shutdown_time)
    if active_deadline_seconds is not None:
        candidates.append(created_at + timedelta(seconds=active_deadline_seconds))
    return min(candidates) if candidates else None


@dataclass(frozen=True)
class Due:
    """A moment that has come (``now``) or how long until it does."""

    now: bool
    wait_seconds: float | None = None
    """Seconds until it comes; None when it has come or never will."""
    stamp_first: bool = False
    """No ``finishedAt`` recorded: write it (now) first; the TTL counts from there."""
    message: str = ""


def after_finish(
    finished_at: datetime | None, ttl_seconds: int | None, now: datetime, what: str = "finished"
) -> Due:
    """Whether an object that finished at ``finished_at`` is past its TTL: the one
    rule for "deleted at finishedAt + TTL" (sandboxes and claims)."""
    if ttl_seconds is None:
        return Due(now=False)
    if finished_at is None:
        return Due(now=False, stamp_first=True)
    at = finished_at + timedelta(seconds=ttl_seconds)
    if now < at:
        return Due(now=False, wait_seconds=(at - now).total_seconds())
    at_text = rfc3339(finished_at, "seconds")
    message = f"{what} at {at_text}, ttlSecondsAfterFinished {ttl_seconds} is over"
    return Due(now=True, message=message)


@dataclass(frozen=True)
class LifetimeDecision:
    expire: bool
    """End the sandbox now: Stopped, reason DeadlineExceeded."""
    wait_seconds: float | None = None
    """Seconds until the deadline or the TTL, when still ahead; None: nothing to wait for."""
    message: str = ""
    delete: bool = False
    """Delete the sandbox now: its deadline under policy Delete, or its TTL is over."""
    stamp_finished: bool = False
    """Finished without ``status.finishedAt``: write it (now) before the TTL counts."""


@dataclass(frozen=True)
class Ending:
    """What a sandbox says about its end: the policy at its deadline and its TTL."""

    delete_at_deadline: bool = False
    ttl_seconds: int | None = None
    kept_by_pool: bool = False
    """A pool member ended by its own fault: the pool's back-off counts it."""


NO_ENDING = Ending()


def decide_lifetime(
    phase: str,
    deadline: datetime | None,
    now: datetime,
    ending: Ending = NO_ENDING,
    finished_at: datetime | None = None,
) -> LifetimeDecision:
    """What to do about a sandbox in ``phase`` whose lifetime ends at ``deadline``."""
    if phase in TERMINAL_PHASES:
        if ending.kept_by_pool:
            return LifetimeDecision(expire=False)
        due = after_finish(finished_at, ending.ttl_seconds, now)
        return LifetimeDecision(
            expire=False,
            wait_seconds=due.wait_seconds,
            message=due.message,
            delete=due.now,
            stamp_finished=due.stamp_first,
        )
    if deadline is None:
        return LifetimeDecision(expire=False)
    if now >= deadline:
        message = f"lifetime ended at {rfc3339(deadline, 'seconds')}"
        if ending.delete_at_deadline:
            return LifetimeDecision(expire=False, delete=True, message=message)
        return LifetimeDecision(expire=True, message=message)
    return LifetimeDecision(expire=False, wait_seconds=(deadline - now).total_seconds())


__all__ = [
    "NO_ENDING",
    "Due",
    "Ending",
    "LifetimeDecision",
    "after_finish",
    "deadline_of",
    "decide_lifetime",
]
