"""The node-health decision over several passes, its status carried between them as
the controller carries it."""

from __future__ import annotations

from datetime import datetime

from sandlot.api.common import Condition
from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.policy.disruption import FleetSummary
from sandlot.policy.nodehealth import (
    Decision,
    DecisionKind,
    NodeView,
    decide,
)
from tests.support.nodehealth import (
    CALM,
    CREATED,
    GRACE,
    GUARD,
    NOW,
    OUTAGE,
    SETTINGS,
    UNTRACKED,
    s,
)


def _run(
    passes: list[tuple[datetime, ObservedRenewal | None, FleetSummary, bool]],
) -> list[Decision]:
    """Decide at each (now, lease, fleet, unschedulable), writing patches and latches back."""
    tracking: NodeHealthTracking = UNTRACKED
    phase: NodePhase | None = None
    conditions: tuple[Condition, ...] = ()
    out = []
    for now, lease, fleet, unschedulable in passes:
        n = NodeView("n1", unschedulable, CREATED, phase, conditions)
        d = decide(n, lease, tracking, now, fleet, GUARD, SETTINGS)
        patch = (
            d.latched(now, 1)
            if d.kind in (DecisionKind.REAP, DecisionKind.DRAIN_ABANDONED)
            else d.patch
        )
        if patch is not None:
            tracking, phase = patch.health, patch.phase
            conditions = patch.conditions if patch.conditions is not None else conditions
        out.append(d)
    return out


def test_recover_after_handled_clears_the_latch_and_a_new_failure_gets_a_new_grace() -> None:
    t0 = NOW
    died = ObservedRenewal(observed_at=t0 - s(60), lease_duration_seconds=60)  # expired at t0
    back = ObservedRenewal(observed_at=t0 + s(1000), lease_duration_seconds=60)  # expires t0+1060
    kinds = [
        d.kind
        for d in _run(
            [
                (t0, died, CALM, False),
                (t0 + GRACE, died, CALM, False),
                (t0 + GRACE + s(30), died, CALM, False),
                (t0 + s(1001), back, CALM, False),
                (t0 + s(1060), back, CALM, False),
                (t0 + s(1060) + GRACE - s(1), back, CALM, False),
                (t0 + s(1060) + GRACE, back, CALM, False),
            ]
        )
    ]
    assert kinds == [
        DecisionKind.START_TRACKING,
        DecisionKind.REAP,
        DecisionKind.HANDLED,
        DecisionKind.CLEAR,
        DecisionKind.START_TRACKING,
        DecisionKind.WAIT,
        DecisionKind.REAP,
    ]


def test_grace_keeps_counting_during_a_hold_so_the_lift_reaps_at_once() -> None:
    died = ObservedRenewal(observed_at=NOW - s(60), lease_duration_seconds=60)  # expired at NOW
    decisions = _run(
        [
            (NOW + s(10), died, OUTAGE, False),
            (NOW + GRACE, died, OUTAGE, False),
            (NOW + GRACE + s(120), died, OUTAGE, False),
            (NOW + GRACE + s(121), died, CALM, False),
            (NOW + GRACE + s(150), died, CALM, False),
        ]
    )
    assert [d.kind for d in decisions] == [
        DecisionKind.START_TRACKING,
        DecisionKind.HOLD,
        DecisionKind.HOLD,
        DecisionKind.REAP,
        DecisionKind.HANDLED,
    ]
    assert all(d.unhealthy_since == NOW for d in decisions)
    # The hold wrote its condition once, not on every pass.
    assert decisions[1].patch is not None
    assert decisions[2].patch is None
    assert decisions[4].patch is None


def test_disabled_clears_the_latch_and_an_uncordoned_dead_node_keeps_its_real_expiry() -> None:
    died = ObservedRenewal(observed_at=NOW - s(60), lease_duration_seconds=60)  # expired at NOW
    decisions = _run(
        [
            (NOW + GRACE, died, CALM, False),
            (NOW + GRACE + s(1), died, CALM, True),
            (NOW + GRACE + s(2), died, CALM, False),
        ]
    )
    assert [d.kind for d in decisions] == [
        DecisionKind.REAP,
        DecisionKind.CLEAR_DISABLED,
        DecisionKind.REAP,
    ]
    assert decisions[1].tracking == UNTRACKED
    assert decisions[1].was_handled
    assert decisions[2].unhealthy_since == NOW
