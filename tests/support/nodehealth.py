"""The node-health decision's inputs at a fixed ``now``: the clock, the settings,
fleets calm and in an outage, and builders of Leases, tracking and nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sandlot.api.common import Condition
from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.api.reasons import ConditionType
from sandlot.policy.disruption import FleetSummary, GuardSettings
from sandlot.policy.nodehealth import NodeHealthSettings, NodeView

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
CREATED = NOW - timedelta(days=1)
GRACE = timedelta(seconds=300)
DRAIN = timedelta(minutes=10)
SETTINGS = NodeHealthSettings()
GUARD = GuardSettings()
REPORT = GUARD.report_every
CALM = FleetSummary(total_not_disabled=10, not_ready=1)
OUTAGE = FleetSummary(total_not_disabled=10, not_ready=8)
LONG_AGO = NOW - timedelta(hours=1)
UNSEEN = SETTINGS.unseen_lease_duration

R, N, D = NodePhase.READY, NodePhase.NOT_READY, NodePhase.DISABLED
HOLD_TRUE = Condition(
    type=ConditionType.GUARD_HOLDING,
    status="True",
    reason="MassFailureSuspected",
    last_transition_time=LONG_AGO,
)
OTHER = Condition(type="AgentConnected", status="True", reason="Heartbeat")


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def lease_expired(ago: timedelta, duration: int = 60) -> ObservedRenewal:
    """A Lease whose last renewal ran out ``ago`` before NOW (negative: still valid)."""
    return ObservedRenewal(observed_at=NOW - ago - s(duration), lease_duration_seconds=duration)


FRESH = lease_expired(-s(50))


def tracked(since: datetime | None, handled: datetime | None = None, count: int | None = None):
    return NodeHealthTracking(unhealthy_since=since, handled_at=handled, handled_count=count)


UNTRACKED = NodeHealthTracking()


def node(
    *,
    unschedulable: bool = False,
    phase: NodePhase | None = N,
    first_seen: datetime = CREATED,
    conditions: tuple[Condition, ...] = (),
    reap_requested: bool = False,
) -> NodeView:
    return NodeView(
        name="n1",
        unschedulable=unschedulable,
        first_seen=first_seen,
        phase=phase,
        conditions=conditions,
        reap_requested=reap_requested,
    )
