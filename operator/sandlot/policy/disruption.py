"""Mass-failure guard: refuse to mark sandboxes Dead when most of the fleet looks lost.

A single node whose lease expires has probably died. Most of the fleet's leases
expiring at once more likely means the nodes lost their path to the API server
(a partition, an overloaded control plane) while their containers keep serving.
Marking every sandbox Dead then would turn a network blip into a fleet-wide
outage: pools would churn replacements onto the few nodes left, and every agent
would tear its surviving containers down when it came back. Kubernetes' node
lifecycle controller slows its evictions for the same reason.

The trade-off: while the guard holds, a fleet that really did die keeps its
sandboxes Running (and in its Services) until the fraction drops. A stuck
endpoint is recoverable; a fleet-wide teardown is not.

Disabled (drained) nodes are left out of the count on both sides: their leases
are expected to stop, and counting them would make a large drain look like an
outage. So are nodes handled (their sandboxes marked Dead) longer ago than the
guard's ``window``: they are the past, not the present outage, and a fleet that
keeps a few long-dead nodes around must not have its guard hold forever.

A fleet that really lost its majority for good (a 3-5 node fleet is one zone away
from it) is held forever all the same: the guard cannot tell, so it says so, again
and again (``hold_reminder_due``), and leaves the call to a person, whose decision
(``sandlot nodes reap``) the node-health policy honours on that node alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from sandlot.api.node import NodePhase
from sandlot.api.settings import Duration


@dataclass(frozen=True)
class FleetSummary:
    """The fleet's health at one moment, as the node-health controller sees it."""

    total_not_disabled: int
    """SandboxNodes whose phase is Ready or NotReady."""
    not_ready: int
    """Of those, the NotReady ones."""

    def __post_init__(self) -> None:
        if self.total_not_disabled < 0:
            raise ValueError(f"total_not_disabled must be >= 0, got {self.total_not_disabled}")
        if not 0 <= self.not_ready <= self.total_not_disabled:
            raise ValueError(
                f"not_ready must be between 0 and total_not_disabled "
                f"({self.total_not_disabled}), got {self.not_ready}"
            )

    @property
    def not_ready_fraction(self) -> float:
        """NotReady share of the nodes that are not Disabled (0.0 for an empty fleet)."""
        if self.total_not_disabled == 0:
            return 0.0
        return self.not_ready / self.total_not_disabled


class GuardSettings(BaseModel):
    """When the guard holds. Validated once, at construction (the operator's settings
    nest this model: ``--disruption-threshold``, ``--min-nodes-for-guard``,
    ``--guard-window``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    disruption_threshold: float = Field(
        default=0.55,
        gt=0.0,
        le=1.0,
        description="Fraction (0-1] of not-Disabled nodes NotReady at once at which the "
        "mass-failure guard holds all Dead marking.",
    )
    min_nodes: int = Field(
        default=3,
        ge=1,
        description="Fewest not-Disabled nodes for which the guard applies at all: in a "
        "smaller fleet one lost node is already a large fraction.",
    )
    window: Duration = Field(
        default=timedelta(minutes=10),
        gt=timedelta(0),
        description="Nodes handled (sandboxes marked Dead) longer ago than this are left "
        "out of both sides of the mass-failure guard's fraction: the past, not the present "
        "outage.",
    )
    report_every: Duration = Field(
        default=timedelta(minutes=10),
        gt=timedelta(0),
        description="A hold is reported again (an Event saying for how long) at each "
        "whole multiple of this since it began.",
    )


@dataclass(frozen=True)
class FleetMember:
    """One SandboxNode as the guard counts it."""

    phase: NodePhase | str
    """Its observed phase now."""
    handled_at: datetime | None = None
    """When its sandboxes were all marked Dead (the handled latch); None if not handled."""


def summarize_fleet(
    members: Iterable[FleetMember], now: datetime, window: timedelta
) -> FleetSummary:
    """Count a fleet's nodes for the guard: Disabled ones and those handled longer
    than ``window`` before ``now`` are left out of both sides."""
    total = not_ready = 0
    for member in members:
        phase = member.phase
        if phase == NodePhase.DISABLED:
            continue
        if member.handled_at is not None and now - member.handled_at > window:
            continue
        total += 1
        if phase == NodePhase.NOT_READY:
            not_ready += 1
    return FleetSummary(total_not_disabled=total, not_ready=not_ready)


def guard_active(fleet: FleetSummary, guard: GuardSettings) -> bool:
    """True when so much of the fleet is NotReady that nothing should be marked Dead.

    The fraction is compared with a plain division: ``11 / 20`` and ``0.55`` round
    to the same double, so a fleet exactly at the threshold holds.
    """
    if fleet.total_not_disabled < guard.min_nodes:
        return False
    return fleet.not_ready_fraction >= guard.disruption_threshold


def next_hold_report(held_since: datetime, now: datetime, every: timedelta) -> datetime:
    """The first whole multiple of ``every`` since ``held_since`` that is after ``now``."""
    if now < held_since:
        return held_since
    return held_since + every * ((now - held_since) // every + 1)


def hold_reminder_due(
    held_since: datetime, last_reported: datetime | None, now: datetime, every: timedelta
) -> bool:
    """A hold is reported once when first seen held (``last_reported`` None: also a new
    leader's first pass, which has not said it yet), then once per whole ``every``
    since it began: a guard that holds for hours is a page, not a single line."""
    if last_reported is None:
        return True
    if now < held_since:
        return False
    since_last = (last_reported - held_since) // every if last_reported >= held_since else -1
    return (now - held_since) // every > since_last
