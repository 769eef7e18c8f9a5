"""The node-health decision beyond the table: its deadline, a deleted node, the latch
after a reap, and the status patch it writes."""

from __future__ import annotations

from datetime import datetime

import pytest

from sandlot.api.node import NodeHealthTracking, ObservedRenewal
from sandlot.api.reasons import SandboxReason
from sandlot.policy.nodehealth import (
    Decision,
    DecisionKind,
    NodeHealthSettings,
    StatusPatch,
    decide,
    decide_deleted,
)
from tests.support.nodehealth import (
    CALM,
    FRESH,
    GRACE,
    GUARD,
    HOLD_TRUE,
    NOW,
    OTHER,
    OUTAGE,
    SETTINGS,
    UNTRACKED,
    N,
    lease_expired,
    node,
    s,
    tracked,
)


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
    assert d.reason == SandboxReason.NODE_DELETED
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
