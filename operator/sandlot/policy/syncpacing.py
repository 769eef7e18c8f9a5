"""When a woken loop of the agent runs its next pass: a token bucket over passes.

A change reaching an idle agent is acted on at once. A fixed tick would put up to
a whole interval between a Sandbox being scheduled and its start, and most
changes come alone. A burst of changes must still not cost a pass each: the
bucket holds up to ``burst`` passes and earns one back every ``interval``; each
pass spends one. While the bucket has a pass, a wake-up runs it now; once it is
empty the next pass waits for the next one earned, and every change arriving
meanwhile shares it (the loop clears its wake-up before a pass starts, so a
change arriving during a pass wakes the next one). With no wake-up at all a pass
still runs ``longest`` after the last one (the periodic resync).

A failed pass empties the bucket, so its retry comes one ``interval`` later
rather than as a burst against a runtime that is failing.

Times are readings of a monotonic clock, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Pacing:
    """How often a woken loop may run."""

    interval: float
    """Seconds to earn back one pass (the sustained rate is one per interval); > 0."""
    burst: int
    """Passes that may run back to back after a quiet time; >= 1."""
    longest: float
    """Seconds from one pass to the next when nothing wakes the loop; >= interval."""

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {self.interval}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")
        if self.longest < self.interval:
            raise ValueError(
                f"longest ({self.longest}s) must be at least interval ({self.interval}s)"
            )


@dataclass(frozen=True)
class PassBudget:
    """The bucket: passes available at ``counted_at``, and when the last pass began."""

    tokens: float
    counted_at: float
    last_pass: float | None = None


def full_budget(pacing: Pacing, now: float) -> PassBudget:
    """A loop that has not run yet: a full bucket, and its first pass is due at once."""
    return PassBudget(tokens=float(pacing.burst), counted_at=now)


def available(budget: PassBudget, pacing: Pacing, now: float) -> float:
    """Passes in the bucket at ``now`` (never more than ``burst``)."""
    earned = max(0.0, now - budget.counted_at) / pacing.interval
    return min(float(pacing.burst), budget.tokens + earned)


def next_pass_at(budget: PassBudget, pacing: Pacing, now: float, *, woken: bool) -> float:
    """When the next pass runs; at or before ``now`` means now.

    Woken (or never run): as soon as the bucket holds a pass. Otherwise at the
    periodic resync, ``longest`` after the last pass began, and not before the
    bucket holds a pass either.
    """
    tokens = available(budget, pacing, now)
    earliest = now if tokens >= 1 else now + (1 - tokens) * pacing.interval
    if woken or budget.last_pass is None:
        return earliest
    return max(earliest, budget.last_pass + pacing.longest)


def take_pass(budget: PassBudget, pacing: Pacing, now: float) -> PassBudget:
    """The bucket once a pass begins at ``now`` (it spends one pass)."""
    tokens = available(budget, pacing, now)
    return PassBudget(tokens=max(0.0, tokens - 1), counted_at=now, last_pass=now)


def wake_after(*, settled: bool, looked: bool, asked: bool) -> bool:
    """Whether the end of one sandbox's work wakes the sync. A pass leaves a key with
    work running alone, so one that ``looked`` at it meanwhile must look again; and
    most work may leave a follow-up (a retry, the next step). Work that ``settled``
    all it was handed and recorded it (a pause or resume, its condition written)
    leaves nothing, unless the end itself ``asked`` for a pass (a change of mode
    that arrived meanwhile could not be handed over)."""
    return asked or looked or not settled


def fail_pass(budget: PassBudget, now: float) -> PassBudget:
    """The bucket after a pass failed at ``now``: empty, so the retry waits an interval."""
    return replace(budget, tokens=0.0, counted_at=now)


__all__ = [
    "Pacing",
    "PassBudget",
    "available",
    "fail_pass",
    "full_budget",
    "next_pass_at",
    "take_pass",
    "wake_after",
]
