"""Properties of the node-health decisions over random histories of renewals and passes.

Each example is a node's life: time steps, lease renewals, drains and uncordons,
the guard switching on and off, and passes of the controller at random moments
(so it misses renewals and recoveries, as a controller with a timer does), with
the status it writes carried from pass to pass. Some histories lose status writes,
as a crashed operator would.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sandlot.api.common import Condition
from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.policy.disruption import FleetSummary, GuardSettings
from sandlot.policy.nodehealth import (
    Decision,
    DecisionKind,
    NodeHealthSettings,
    NodeView,
    decide,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
GUARD = GuardSettings()
CALM = FleetSummary(total_not_disabled=10, not_ready=1)
OUTAGE = FleetSummary(total_not_disabled=10, not_ready=9)


@dataclass(frozen=True)
class Step:
    advance: int  # seconds
    renew: bool
    observe: bool
    unschedulable: bool
    held: bool
    write_lost: bool


@dataclass(frozen=True)
class Pass:
    now: datetime
    decision: Decision
    last_valid: datetime  # end of the last moment the node's lease made it Ready
    renewed_since_last_pass: bool
    unschedulable: bool
    held: bool


steps = st.builds(
    Step,
    advance=st.integers(min_value=0, max_value=400),
    renew=st.booleans(),
    observe=st.booleans(),
    unschedulable=st.booleans(),
    held=st.booleans(),
    write_lost=st.booleans(),
)


@st.composite
def histories(draw: st.DrawFn, *, lossy: bool, drains: bool, holds: bool):
    duration = draw(st.integers(min_value=1, max_value=120))
    node_settings = NodeHealthSettings(
        grace_period=timedelta(seconds=draw(st.integers(min_value=1, max_value=600))),
        drain_timeout=timedelta(seconds=draw(st.integers(min_value=1, max_value=900))),
        unseen_lease_duration=timedelta(seconds=duration),
    )
    first_seen = T0 - timedelta(seconds=draw(st.integers(min_value=0, max_value=1000)))
    has_lease = draw(st.booleans())
    history = draw(st.lists(steps, min_size=1, max_size=60))
    history = [
        Step(
            s.advance,
            s.renew,
            s.observe,
            s.unschedulable and drains,
            s.held and holds,
            s.write_lost and lossy,
        )
        for s in history
    ]
    return duration, node_settings, first_seen, has_lease, history


def simulate(
    duration: int,
    node_settings: NodeHealthSettings,
    first_seen: datetime,
    has_lease: bool,
    history: list[Step],
) -> list[Pass]:
    now = T0
    renew_time: datetime | None = None
    tracking = NodeHealthTracking()
    phase: NodePhase | None = None
    conditions: tuple[Condition, ...] = ()
    renewed = False
    passes = []
    for step in history:
        now += timedelta(seconds=step.advance)
        if step.renew:
            renew_time, has_lease, renewed = now, True, True
        if not step.observe:
            continue
        renewal = (
            ObservedRenewal(observed_at=renew_time, lease_duration_seconds=duration)
            if has_lease and renew_time is not None
            else None
        )
        node = NodeView("n1", step.unschedulable, first_seen, phase, conditions)
        fleet = OUTAGE if step.held else CALM
        d = decide(node, renewal, tracking, now, fleet, GUARD, node_settings)
        last_valid = (first_seen if renew_time is None else renew_time) + timedelta(
            seconds=duration
        )
        passes.append(Pass(now, d, last_valid, renewed, step.unschedulable, step.held))
        renewed = False
        latches = d.kind in (DecisionKind.REAP, DecisionKind.DRAIN_ABANDONED)
        patch = d.latched(now, 1) if latches else d.patch
        if patch is not None and not step.write_lost:
            tracking, phase = patch.health, patch.phase
            if patch.conditions is not None:
                conditions = patch.conditions
    return passes


@settings(max_examples=400, deadline=None)
@given(histories(lossy=True, drains=True, holds=True))
def test_never_reaps_a_node_whose_lease_was_valid_within_the_grace_window(history) -> None:
    duration, node_settings, first_seen, has_lease, steps_ = history
    for p in simulate(duration, node_settings, first_seen, has_lease, steps_):
        # The lease was valid up to (not including) last_valid; nothing is marked Dead
        # unless that moment lies a whole grace (or drain timeout) before now.
        if p.decision.kind is DecisionKind.REAP:
            assert p.last_valid + node_settings.grace_period <= p.now
        if p.decision.kind is DecisionKind.DRAIN_ABANDONED:
            assert p.last_valid + node_settings.drain_timeout <= p.now
        if p.decision.marks_dead:
            assert not p.held


@settings(max_examples=400, deadline=None)
@given(histories(lossy=True, drains=True, holds=True))
def test_unhealthy_since_is_a_lease_expiry_never_the_time_of_notice(history) -> None:
    duration, node_settings, first_seen, has_lease, steps_ = history
    for p in simulate(duration, node_settings, first_seen, has_lease, steps_):
        since = p.decision.unhealthy_since
        if since is None:
            continue
        assert since <= p.now
        if p.decision.kind in (DecisionKind.START_TRACKING, DecisionKind.REAP):
            # Tracking only ever records the current expiry of the last observed renewal.
            assert since == p.last_valid


@settings(max_examples=400, deadline=None)
@given(histories(lossy=False, drains=True, holds=True))
def test_a_dead_node_is_reaped_once_per_episode_then_costs_nothing(history) -> None:
    duration, node_settings, first_seen, has_lease, steps_ = history
    reaped = was_disabled = False
    for p in simulate(duration, node_settings, first_seen, has_lease, steps_):
        d = p.decision
        if p.renewed_since_last_pass or d.kind in (DecisionKind.CLEAR, DecisionKind.CLEAR_DISABLED):
            reaped = False
        if p.unschedulable:
            if d.kind is DecisionKind.DRAIN_ABANDONED:
                reaped = True
            was_disabled = True
            continue
        if reaped:
            assert d.kind is DecisionKind.HANDLED
            # No write, except the phase itself when an uncordon made it NotReady again.
            assert d.patch is None or (was_disabled and d.patch.health == d.tracking)
        was_disabled = False
        if d.kind is DecisionKind.REAP:
            reaped = True


@settings(max_examples=400, deadline=None)
@given(histories(lossy=False, drains=False, holds=True))
def test_once_the_grace_is_over_and_the_guard_lifts_the_node_is_reaped(history) -> None:
    duration, node_settings, first_seen, has_lease, steps_ = history
    reaped = False
    for p in simulate(duration, node_settings, first_seen, has_lease, steps_):
        d = p.decision
        if p.renewed_since_last_pass:
            reaped = False
        overdue = p.now >= p.last_valid + node_settings.grace_period
        if overdue and not p.held:
            assert d.kind is (DecisionKind.HANDLED if reaped else DecisionKind.REAP)
        if overdue and p.held and not reaped:
            assert d.kind is DecisionKind.HOLD
        if d.kind is DecisionKind.REAP:
            reaped = True
