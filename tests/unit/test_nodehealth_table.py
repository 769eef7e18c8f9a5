"""The node-health state machine, row by row of the spec's table, at a fixed ``now``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pytest

from sandlot.api.node import NodeHealthTracking, ObservedRenewal
from sandlot.api.reasons import ConditionType, SandboxReason
from sandlot.policy.disruption import FleetSummary
from sandlot.policy.nodehealth import DecisionKind, NodeView, decide
from tests.support.nodehealth import (
    CALM,
    DRAIN,
    FRESH,
    GRACE,
    GUARD,
    HOLD_TRUE,
    NOW,
    OTHER,
    OUTAGE,
    REPORT,
    SETTINGS,
    UNSEEN,
    UNTRACKED,
    D,
    R,
    lease_expired,
    node,
    s,
    tracked,
)


@dataclass(frozen=True)
class Row:
    id: str
    node: NodeView
    lease: ObservedRenewal | None
    tracking: NodeHealthTracking | None
    kind: DecisionKind
    fleet: FleetSummary = CALM
    reason: str | None = None
    since: datetime | None = None
    handled_at: datetime | None = None
    wake_at: datetime | None = None
    writes: bool = True
    was: tuple[bool, bool] = (False, False)  # (was_tracking, was_handled)
    conditions: tuple[str, ...] | None = field(default=None)  # condition types, when written


ROWS = [
    # Ready ---------------------------------------------------------------------------------
    Row(
        "ready_clears_unhealthy_since_and_the_latch",
        node(),
        FRESH,
        tracked(NOW - s(400), NOW - s(100), 3),
        DecisionKind.CLEAR,
        was=(True, True),
    ),
    Row(
        "ready_clears_unhealthy_since_during_grace",
        node(),
        FRESH,
        tracked(NOW - s(30)),
        DecisionKind.CLEAR,
        was=(True, False),
    ),
    Row(
        "ready_and_untracked_writes_nothing",
        node(phase=R),
        FRESH,
        UNTRACKED,
        DecisionKind.CLEAR,
        writes=False,
    ),
    Row(
        "ready_with_no_stored_status_writes_only_its_phase",
        node(phase=None),
        FRESH,
        None,
        DecisionKind.CLEAR,
    ),
    Row(
        "ready_while_the_guard_holds_still_just_clears",
        node(phase=R),
        FRESH,
        UNTRACKED,
        DecisionKind.CLEAR,
        fleet=OUTAGE,
        writes=False,
    ),
    Row(
        "ready_until_the_last_instant_before_expiry",
        node(phase=R),
        lease_expired(-s(0.001)),
        UNTRACKED,
        DecisionKind.CLEAR,
        writes=False,
    ),
    Row(
        "ready_removes_a_leftover_hold_condition",
        node(phase=R, conditions=(OTHER, HOLD_TRUE)),
        FRESH,
        UNTRACKED,
        DecisionKind.CLEAR,
        conditions=("AgentConnected",),
    ),
    # Disabled ------------------------------------------------------------------------------
    Row(
        "disabled_clears_tracking_and_leaves_cleanup_to_the_drain",
        node(unschedulable=True),
        lease_expired(s(100)),
        tracked(NOW - s(100)),
        DecisionKind.CLEAR_DISABLED,
        wake_at=NOW - s(100) + DRAIN,
        was=(True, False),
    ),
    Row(
        "disabled_clears_the_handled_latch",
        node(unschedulable=True),
        lease_expired(s(400)),
        tracked(NOW - s(400), NOW - s(100), 2),
        DecisionKind.CLEAR_DISABLED,
        wake_at=NOW - s(400) + DRAIN,
        was=(True, True),
    ),
    Row(
        "disabled_with_a_live_lease_leaves_waking_to_the_timer",
        node(unschedulable=True, phase=D),
        FRESH,
        UNTRACKED,
        DecisionKind.CLEAR_DISABLED,
        writes=False,
    ),
    Row(
        "disabled_one_second_before_drain_timeout_still_waits_for_the_drain",
        node(unschedulable=True, phase=D),
        lease_expired(DRAIN - s(1)),
        UNTRACKED,
        DecisionKind.CLEAR_DISABLED,
        wake_at=NOW + s(1),
        writes=False,
    ),
    Row(
        "drain_abandoned_after_drain_timeout_marks_leftovers_dead",
        node(unschedulable=True, phase=D),
        lease_expired(DRAIN + s(1)),
        UNTRACKED,
        DecisionKind.DRAIN_ABANDONED,
        reason=SandboxReason.DRAIN_ABANDONED,
        since=NOW - DRAIN - s(1),
    ),
    Row(
        "drain_abandoned_exactly_at_drain_timeout",
        node(unschedulable=True, phase=D),
        lease_expired(DRAIN),
        UNTRACKED,
        DecisionKind.DRAIN_ABANDONED,
        reason=SandboxReason.DRAIN_ABANDONED,
        since=NOW - DRAIN,
    ),
    Row(
        "drain_abandoned_and_handled_does_nothing",
        node(unschedulable=True, phase=D),
        lease_expired(DRAIN + s(60)),
        tracked(NOW - DRAIN - s(60), NOW - s(60), 4),
        DecisionKind.HANDLED,
        since=NOW - DRAIN - s(60),
        handled_at=NOW - s(60),
        writes=False,
        was=(True, True),
    ),
    Row(
        "drain_abandoned_is_held_by_the_guard",
        node(unschedulable=True, phase=D),
        lease_expired(DRAIN + s(1)),
        UNTRACKED,
        DecisionKind.HOLD,
        fleet=OUTAGE,
        since=NOW - DRAIN - s(1),
        wake_at=NOW - s(1) + REPORT,
        conditions=(ConditionType.GUARD_HOLDING,),
    ),
    Row(
        "disabled_node_never_renewed_is_abandoned_drain_timeout_after_its_unseen_lease",
        node(unschedulable=True, phase=D, first_seen=NOW - DRAIN - UNSEEN),
        None,
        UNTRACKED,
        DecisionKind.DRAIN_ABANDONED,
        reason=SandboxReason.DRAIN_ABANDONED,
        since=NOW - DRAIN,
    ),
    # NotReady, first seen ------------------------------------------------------------------
    Row(
        "first_not_ready_records_the_lease_expiry_not_the_notice_time",
        node(phase=R),
        lease_expired(s(42)),
        UNTRACKED,
        DecisionKind.START_TRACKING,
        since=NOW - s(42),
        wake_at=NOW - s(42) + GRACE,
    ),
    Row(
        "not_ready_from_the_exact_moment_of_expiry",
        node(phase=R),
        lease_expired(s(0)),
        UNTRACKED,
        DecisionKind.START_TRACKING,
        since=NOW,
        wake_at=NOW + GRACE,
    ),
    Row(
        "first_seen_after_the_grace_already_ended_reaps_at_once",
        node(phase=R),
        lease_expired(GRACE + s(60)),
        UNTRACKED,
        DecisionKind.REAP,
        reason=SandboxReason.NODE_LOST,
        since=NOW - GRACE - s(60),
    ),
    Row(
        "node_never_renewed_is_not_ready_a_lease_duration_after_first_seen",
        node(phase=None, first_seen=NOW - s(100) - UNSEEN),
        None,
        None,
        DecisionKind.START_TRACKING,
        since=NOW - s(100),
        wake_at=NOW - s(100) + GRACE,
    ),
    Row(
        "node_never_renewed_is_reaped_a_lease_duration_and_grace_after_first_seen",
        node(first_seen=NOW - GRACE - UNSEEN),
        None,
        tracked(NOW - GRACE),
        DecisionKind.REAP,
        reason=SandboxReason.NODE_LOST,
        since=NOW - GRACE,
        writes=False,
        was=(True, False),
    ),
    Row(
        "node_first_seen_within_a_lease_duration_is_ready",
        node(first_seen=NOW - s(10)),
        None,
        UNTRACKED,
        DecisionKind.CLEAR,
    ),
    # NotReady, within grace ----------------------------------------------------------------
    Row(
        "within_grace_waits_until_the_exact_deadline",
        node(),
        lease_expired(s(120)),
        tracked(NOW - s(120)),
        DecisionKind.WAIT,
        since=NOW - s(120),
        wake_at=NOW + s(180),
        writes=False,
        was=(True, False),
    ),
    Row(
        "one_second_before_the_deadline_still_waits",
        node(),
        lease_expired(GRACE - s(1)),
        tracked(NOW - GRACE + s(1)),
        DecisionKind.WAIT,
        since=NOW - GRACE + s(1),
        wake_at=NOW + s(1),
        writes=False,
        was=(True, False),
    ),
    Row(
        "lease_deleted_during_grace_does_not_move_unhealthy_since_back",
        node(),
        None,
        tracked(NOW - s(100)),
        DecisionKind.WAIT,
        since=NOW - s(100),
        wake_at=NOW + s(200),
        writes=False,
        was=(True, False),
    ),
    Row(
        "within_grace_the_guard_changes_nothing",
        node(),
        lease_expired(s(120)),
        tracked(NOW - s(120)),
        DecisionKind.WAIT,
        fleet=OUTAGE,
        since=NOW - s(120),
        wake_at=NOW + s(180),
        writes=False,
        was=(True, False),
    ),
    # NotReady, grace over ------------------------------------------------------------------
    Row(
        "grace_over_and_unhandled_reaps_with_node_lost",
        node(),
        lease_expired(GRACE + s(1)),
        tracked(NOW - GRACE - s(1)),
        DecisionKind.REAP,
        reason=SandboxReason.NODE_LOST,
        since=NOW - GRACE - s(1),
        writes=False,
        was=(True, False),
    ),
    Row(
        "grace_over_exactly_at_the_deadline_reaps",
        node(),
        lease_expired(GRACE),
        tracked(NOW - GRACE),
        DecisionKind.REAP,
        reason=SandboxReason.NODE_LOST,
        since=NOW - GRACE,
        writes=False,
        was=(True, False),
    ),
    Row(
        "handled_does_nothing_and_writes_nothing",
        node(),
        lease_expired(s(3600)),
        tracked(NOW - s(3600), NOW - s(3000), 5),
        DecisionKind.HANDLED,
        since=NOW - s(3600),
        handled_at=NOW - s(3000),
        writes=False,
        was=(True, True),
    ),
    Row(
        "handled_stays_handled_while_the_guard_holds",
        node(),
        lease_expired(s(3600)),
        tracked(NOW - s(3600), NOW - s(3000), 5),
        DecisionKind.HANDLED,
        fleet=OUTAGE,
        since=NOW - s(3600),
        handled_at=NOW - s(3000),
        writes=False,
        was=(True, True),
    ),
    Row(
        "lease_renewed_since_the_latch_starts_a_new_episode_without_it",
        node(),
        lease_expired(s(10)),
        tracked(NOW - s(3600), NOW - s(3000), 5),
        DecisionKind.START_TRACKING,
        since=NOW - s(10),
        wake_at=NOW - s(10) + GRACE,
        was=(True, True),
    ),
    Row(
        "lease_renewed_unseen_during_grace_restarts_the_grace",
        node(),
        lease_expired(s(10)),
        tracked(NOW - s(290)),
        DecisionKind.START_TRACKING,
        since=NOW - s(10),
        wake_at=NOW - s(10) + GRACE,
        was=(True, False),
    ),
    # Mass-failure guard --------------------------------------------------------------------
    Row(
        "hold_blocks_the_reap_and_says_so_in_a_condition",
        node(conditions=(OTHER,)),
        lease_expired(GRACE + s(1)),
        tracked(NOW - GRACE - s(1)),
        DecisionKind.HOLD,
        fleet=OUTAGE,
        since=NOW - GRACE - s(1),
        wake_at=NOW - s(1) + REPORT,
        conditions=("AgentConnected", ConditionType.GUARD_HOLDING),
        was=(True, False),
    ),
    Row(
        "hold_still_starts_tracking_an_untracked_node_at_its_lease_expiry",
        node(phase=R),
        lease_expired(GRACE + s(30)),
        UNTRACKED,
        DecisionKind.HOLD,
        fleet=OUTAGE,
        since=NOW - GRACE - s(30),
        wake_at=NOW - s(30) + REPORT,
        conditions=(ConditionType.GUARD_HOLDING,),
    ),
    Row(
        "hold_repeated_writes_nothing",
        node(conditions=(HOLD_TRUE,)),
        lease_expired(GRACE + s(1)),
        tracked(NOW - GRACE - s(1)),
        DecisionKind.HOLD,
        fleet=OUTAGE,
        since=NOW - GRACE - s(1),
        wake_at=NOW - s(1) + REPORT,
        writes=False,
        was=(True, False),
    ),
    Row(
        "hold_wakes_at_its_next_whole_report_interval",
        node(conditions=(HOLD_TRUE,)),
        lease_expired(GRACE + REPORT * 2 + s(5)),
        tracked(NOW - GRACE - REPORT * 2 - s(5)),
        DecisionKind.HOLD,
        fleet=OUTAGE,
        since=NOW - GRACE - REPORT * 2 - s(5),
        wake_at=NOW - s(5) + REPORT,
        writes=False,
        was=(True, False),
    ),
    # An operator's reap decision (sandlot nodes reap) -------------------------------------
    Row(
        "manual_reap_goes_through_a_hold_and_removes_its_condition",
        node(conditions=(OTHER, HOLD_TRUE), reap_requested=True),
        lease_expired(GRACE + s(600)),
        tracked(NOW - GRACE - s(600)),
        DecisionKind.MANUAL_REAP,
        fleet=OUTAGE,
        reason=SandboxReason.MANUAL_REAP,
        since=NOW - GRACE - s(600),
        conditions=("AgentConnected",),
        was=(True, False),
    ),
    Row(
        "manual_reap_does_not_wait_for_the_grace_period",
        node(reap_requested=True),
        lease_expired(s(10)),
        tracked(NOW - s(10)),
        DecisionKind.MANUAL_REAP,
        reason=SandboxReason.MANUAL_REAP,
        since=NOW - s(10),
        writes=False,
        was=(True, False),
    ),
    Row(
        "manual_reap_of_an_episode_the_node_renewed_out_of_is_ignored",
        node(reap_requested=True),
        lease_expired(s(10)),
        tracked(NOW - s(400)),
        DecisionKind.START_TRACKING,
        since=NOW - s(10),
        wake_at=NOW - s(10) + GRACE,
        was=(True, False),
    ),
    Row(
        "manual_reap_of_a_ready_node_is_ignored",
        node(phase=R, reap_requested=True),
        FRESH,
        tracked(NOW - s(30)),
        DecisionKind.CLEAR,
        was=(True, False),
    ),
    Row(
        "manual_reap_of_a_drained_node_is_ignored",
        node(unschedulable=True, phase=D, reap_requested=True),
        lease_expired(s(30)),
        UNTRACKED,
        DecisionKind.CLEAR_DISABLED,
        wake_at=NOW - s(30) + DRAIN,
        writes=False,
    ),
    Row(
        "manual_reap_of_a_handled_node_marks_nothing_again",
        node(reap_requested=True),
        lease_expired(GRACE + s(100)),
        tracked(NOW - GRACE - s(100), NOW - s(50), 2),
        DecisionKind.HANDLED,
        since=NOW - GRACE - s(100),
        handled_at=NOW - s(50),
        writes=False,
        was=(True, True),
    ),
    Row(
        "hold_lifted_reaps_at_once_and_removes_the_condition",
        node(conditions=(OTHER, HOLD_TRUE)),
        lease_expired(GRACE + s(600)),
        tracked(NOW - GRACE - s(600)),
        DecisionKind.REAP,
        reason=SandboxReason.NODE_LOST,
        since=NOW - GRACE - s(600),
        conditions=("AgentConnected",),
        was=(True, False),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decide(row: Row) -> None:
    d = decide(row.node, row.lease, row.tracking, NOW, row.fleet, GUARD, SETTINGS)

    assert d.kind is row.kind
    assert d.reason == row.reason
    assert d.marks_dead is (row.reason is not None)
    assert d.tracking.unhealthy_since == row.since
    assert d.unhealthy_since == row.since
    assert d.tracking.handled_at == row.handled_at
    assert d.wake_at == row.wake_at
    assert (d.was_tracking, d.was_handled) == row.was
    assert d.guard_active is (row.fleet is OUTAGE)
    if not row.writes:
        assert d.patch is None
        return
    assert d.patch is not None
    assert d.patch.phase == d.phase
    assert d.patch.health == d.tracking
    if row.conditions is None:
        assert d.patch.conditions is None
    else:
        assert d.patch.conditions is not None
        assert tuple(c.type for c in d.patch.conditions) == row.conditions
