"""The node-health state machine, row by row of the spec's table, at a fixed ``now``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from sandlot.api.common import Condition
from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.api.sandbox import REASON_DRAIN_ABANDONED, REASON_NODE_DELETED, REASON_NODE_LOST
from sandlot.policy.disruption import FleetSummary, GuardSettings
from sandlot.policy.nodehealth import (
    HOLD_CONDITION_TYPE,
    Decision,
    DecisionKind,
    NodeHealthSettings,
    NodeView,
    StatusPatch,
    decide,
    decide_deleted,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
CREATED = NOW - timedelta(days=1)
GRACE = timedelta(seconds=300)
DRAIN = timedelta(minutes=10)
SETTINGS = NodeHealthSettings()
GUARD = GuardSettings()
CALM = FleetSummary(total_not_disabled=10, not_ready=1)
OUTAGE = FleetSummary(total_not_disabled=10, not_ready=8)
LONG_AGO = NOW - timedelta(hours=1)
UNSEEN = SETTINGS.unseen_lease_duration

R, N, D = NodePhase.READY, NodePhase.NOT_READY, NodePhase.DISABLED
HOLD_TRUE = Condition(
    type=HOLD_CONDITION_TYPE,
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
) -> NodeView:
    return NodeView(
        name="n1",
        unschedulable=unschedulable,
        first_seen=first_seen,
        phase=phase,
        conditions=conditions,
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
        reason=REASON_DRAIN_ABANDONED,
        since=NOW - DRAIN - s(1),
    ),
    Row(
        "drain_abandoned_exactly_at_drain_timeout",
        node(unschedulable=True, phase=D),
        lease_expired(DRAIN),
        UNTRACKED,
        DecisionKind.DRAIN_ABANDONED,
        reason=REASON_DRAIN_ABANDONED,
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
        conditions=(HOLD_CONDITION_TYPE,),
    ),
    Row(
        "disabled_node_never_renewed_is_abandoned_drain_timeout_after_its_unseen_lease",
        node(unschedulable=True, phase=D, first_seen=NOW - DRAIN - UNSEEN),
        None,
        UNTRACKED,
        DecisionKind.DRAIN_ABANDONED,
        reason=REASON_DRAIN_ABANDONED,
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
        reason=REASON_NODE_LOST,
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
        reason=REASON_NODE_LOST,
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
        reason=REASON_NODE_LOST,
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
        reason=REASON_NODE_LOST,
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
        conditions=("AgentConnected", HOLD_CONDITION_TYPE),
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
        conditions=(HOLD_CONDITION_TYPE,),
    ),
    Row(
        "hold_repeated_writes_nothing",
        node(conditions=(HOLD_TRUE,)),
        lease_expired(GRACE + s(1)),
        tracked(NOW - GRACE - s(1)),
        DecisionKind.HOLD,
        fleet=OUTAGE,
        since=NOW - GRACE - s(1),
        writes=False,
        was=(True, False),
    ),
    Row(
        "hold_lifted_reaps_at_once_and_removes_the_condition",
        node(conditions=(OTHER, HOLD_TRUE)),
        lease_expired(GRACE + s(600)),
        tracked(NOW - GRACE - s(600)),
        DecisionKind.REAP,
        reason=REASON_NODE_LOST,
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


@pytest.mark.parametrize(
    ("lease", "tracking", "settings", "expected"),
    [
        (lease_expired(s(10)), tracked(NOW - s(10)), SETTINGS, NOW - s(10) + GRACE),
        (
            lease_expired(s(10)),
            tracked(NOW - s(10)),
            NodeHealthSettings(grace_period=s(30)),
            NOW - s(10) + s(30),
        ),
        (FRESH, UNTRACKED, SETTINGS, None),
        (FRESH, None, SETTINGS, None),
    ],
    ids=[
        "deadline_is_unhealthy_since_plus_default_grace",
        "deadline_follows_a_configured_grace",
        "untracked_node_has_no_deadline",
        "missing_tracking_has_no_deadline",
    ],
)
def test_decision_deadline(
    lease: ObservedRenewal,
    tracking: NodeHealthTracking | None,
    settings: NodeHealthSettings,
    expected: datetime | None,
) -> None:
    d = decide(node(), lease, tracking, NOW, CALM, GUARD, settings)
    assert d.deadline == expected
    assert d.wake_at == expected


def test_deleted_node_marks_its_sandboxes_dead_and_clears_the_latch() -> None:
    d = decide_deleted(tracked(NOW - s(3600), NOW - s(3000), 5))
    assert d.kind is DecisionKind.DELETED
    assert d.reason == REASON_NODE_DELETED
    assert d.marks_dead
    assert d.tracking == UNTRACKED
    assert (d.was_tracking, d.was_handled) == (True, True)
    # The object is gone: there is no status to write.
    assert d.patch is None


def test_deleted_node_is_not_held_by_the_guard() -> None:
    assert decide_deleted(None).kind is DecisionKind.DELETED


def _reap() -> Decision:
    n = node(conditions=(OTHER, HOLD_TRUE))
    return decide(n, lease_expired(GRACE), UNTRACKED, NOW, CALM, GUARD, SETTINGS)


def test_latch_after_full_success_records_time_and_count_and_keeps_the_episode() -> None:
    latched = _reap().latched(NOW, 3)
    assert latched.phase == N
    assert latched.health == tracked(NOW - GRACE, NOW, 3).model_copy(
        update={"last_renewal": lease_expired(GRACE)}
    )
    # The hold condition's removal rides along, so success costs a single write.
    assert latched.conditions is not None
    assert [c.type for c in latched.conditions] == ["AgentConnected"]


def test_latch_with_nothing_to_mark_still_latches() -> None:
    assert _reap().latched(NOW, 0).health.handled_count == 0


@pytest.mark.parametrize(
    "kind_decision",
    [
        decide(node(), FRESH, UNTRACKED, NOW, CALM, GUARD),
        decide(node(), lease_expired(s(10)), UNTRACKED, NOW, CALM, GUARD),
        decide(node(), lease_expired(GRACE), UNTRACKED, NOW, OUTAGE, GUARD),
        decide_deleted(None),
    ],
    ids=[
        "clear_sets_no_latch",
        "start_tracking_sets_no_latch",
        "hold_sets_no_latch",
        "deleted_sets_no_latch",
    ],
)
def test_only_reap_and_drain_abandoned_latch(kind_decision: Decision) -> None:
    with pytest.raises(ValueError, match="sets no latch"):
        kind_decision.latched(NOW, 1)


def test_status_patch_clears_tracking_with_explicit_nulls() -> None:
    d = decide(node(), FRESH, tracked(NOW - s(400), NOW - s(100), 3), NOW, CALM, GUARD)
    assert d.patch is not None
    assert d.patch.wire() == {
        "phase": "Ready",
        "health": {
            "unhealthySince": None,
            "lastRenewal": None,
            "handledAt": None,
            "handledCount": None,
        },
    }


def test_status_patch_sends_conditions_whole_only_when_they_change() -> None:
    patch = StatusPatch(phase=N, health=tracked(NOW), conditions=(OTHER,))
    body = patch.wire()
    assert body["conditions"] == [OTHER.wire()]
    assert body["health"]["unhealthySince"] == "2030-01-01T12:00:00Z"


# --- sequences: several passes, status carried between them as the controller would --------


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


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"grace_period": 0}, "grace_period"),
        ({"grace_period": -5}, "grace_period"),
        ({"drain_timeout": 0}, "drain_timeout"),
        ({"grace": 300}, "grace"),
    ],
    ids=[
        "refuses_a_zero_grace_period",
        "refuses_a_negative_grace_period",
        "refuses_a_zero_drain_timeout",
        "refuses_an_unknown_setting",
    ],
)
def test_settings_refuse_bad_values_naming_the_field(
    kwargs: dict[str, int], field_name: str
) -> None:
    with pytest.raises(ValidationError, match=field_name):
        NodeHealthSettings(**kwargs)  # type: ignore[arg-type]


def test_settings_defaults_match_the_spec() -> None:
    assert SETTINGS.grace_period == s(300)
    assert SETTINGS.drain_timeout == timedelta(minutes=10)
    assert NodeHealthSettings(grace_period=30).grace_period == s(30)  # type: ignore[arg-type]


def test_decide_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="now must be timezone-aware"):
        decide(node(), FRESH, UNTRACKED, NOW.replace(tzinfo=None), CALM, GUARD)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ObservedRenewal(observed_at=NOW.replace(tzinfo=None), lease_duration_seconds=60),
        lambda: ObservedRenewal(observed_at=NOW, lease_duration_seconds=-1),
        lambda: node(first_seen=CREATED.replace(tzinfo=None)),
    ],
    ids=[
        "renewal_refuses_a_naive_observed_at",
        "renewal_refuses_a_negative_duration",
        "node_refuses_a_naive_first_seen",
    ],
)
def test_inputs_refuse_bad_values(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        build()
