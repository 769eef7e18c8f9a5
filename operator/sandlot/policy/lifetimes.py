"""When a sandbox's lifetime ends, and what to do about it now: a pure decision.

A sandbox may carry an absolute ``spec.shutdownTime`` and a relative
``spec.activeDeadlineSeconds``, counted from its creation (the API server's
``creationTimestamp``), so a sandbox that never got a node ends too, as a Job's
deadline does. With both, the earlier wins. At the deadline, judged on the
operator's clock, a sandbox that is not terminal yet ends ``Stopped`` with reason
``DeadlineExceeded``; before it, the decision says how long to wait, so the
operator's work queue wakes the key at that second instead of polling.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sandlot.api.sandbox import TERMINAL_PHASES

REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"


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
class LifetimeDecision:
    expire: bool
    """End the sandbox now: Stopped, reason DeadlineExceeded."""
    wait_seconds: float | None = None
    """Seconds until the deadline, when it is still ahead; None: nothing to wait for."""
    message: str = ""


def decide_lifetime(phase: str, deadline: datetime | None, now: datetime) -> LifetimeDecision:
    """What to do about a sandbox in ``phase`` whose lifetime ends at ``deadline``."""
    if deadline is None or phase in TERMINAL_PHASES:
        return LifetimeDecision(expire=False)
    if now >= deadline:
        return LifetimeDecision(
            expire=True, message=f"lifetime ended at {deadline.isoformat().replace('+00:00', 'Z')}"
        )
    return LifetimeDecision(expire=False, wait_seconds=(deadline - now).total_seconds())


__all__ = ["REASON_DEADLINE_EXCEEDED", "LifetimeDecision", "deadline_of", "decide_lifetime"]
