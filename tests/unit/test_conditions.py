"""Conditions merge as ``meta.SetStatusCondition`` does: the time moves with the status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandlot.api.common import Condition
from sandlot.api.node import NodePhase
from sandlot.policy.conditions import parse_conditions, set_condition
from sandlot.policy.nodehealth import ready_conditions

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(hours=1)
READY = Condition(
    type="Ready", status="True", reason="LeaseRenewed", message="ok", last_transition_time=EARLIER
)
OTHER = Condition(type="Scheduled", status="True", reason="Bound", last_transition_time=EARLIER)


@pytest.mark.parametrize(
    ("current", "new", "expected"),
    [
        (
            (READY, OTHER),
            Condition(type="Ready", status="True", reason="Renewed", message="still ok"),
            (READY.model_copy(update={"reason": "Renewed", "message": "still ok"}), OTHER),
        ),
        (
            (READY, OTHER),
            Condition(type="Ready", status="False", reason="LeaseExpired"),
            (
                Condition(
                    type="Ready", status="False", reason="LeaseExpired", last_transition_time=NOW
                ),
                OTHER,
            ),
        ),
        (
            (OTHER,),
            Condition(type="Ready", status="Unknown", reason="NoLease"),
            (
                OTHER,
                Condition(
                    type="Ready", status="Unknown", reason="NoLease", last_transition_time=NOW
                ),
            ),
        ),
        (
            (READY,),
            Condition(type="Ready", status="True", reason="LeaseRenewed", observed_generation=4),
            (READY.model_copy(update={"message": "", "observed_generation": 4}),),
        ),
        (
            (READY.model_copy(update={"observed_generation": 3}),),
            Condition(type="Ready", status="True", reason="LeaseRenewed", message="ok"),
            (READY.model_copy(update={"observed_generation": 3}),),
        ),
        (
            (READY.model_copy(update={"last_transition_time": None}),),
            Condition(type="Ready", status="True", reason="LeaseRenewed", message="ok"),
            (READY.model_copy(update={"last_transition_time": NOW}),),
        ),
    ],
    ids=[
        "reason_and_message_change_keeps_the_transition_time",
        "status_change_moves_the_transition_time_to_now_in_place",
        "new_type_is_appended_with_now",
        "observed_generation_is_set_when_given",
        "observed_generation_is_kept_when_not_given",
        "a_missing_transition_time_is_filled_in",
    ],
)
def test_set_condition(
    current: tuple[Condition, ...], new: Condition, expected: tuple[Condition, ...]
) -> None:
    assert set_condition(current, new, NOW) == expected


def test_set_condition_takes_the_new_conditions_own_time_on_a_transition() -> None:
    stamp = NOW - timedelta(seconds=5)
    new = Condition(type="Ready", status="False", reason="X", last_transition_time=stamp)
    (merged,) = set_condition((READY,), new, NOW)
    assert merged.last_transition_time == stamp


def test_conditions_round_trip_the_wire_with_observed_generation() -> None:
    wire = [{"type": "Ready", "status": "True", "reason": "R", "observedGeneration": 7}]
    (parsed,) = parse_conditions(wire)
    assert parsed.observed_generation == 7
    assert parsed.wire() == {**wire[0], "message": ""}


@pytest.mark.parametrize(
    ("phase", "current", "expected_status", "expected_time"),
    [
        (NodePhase.NOT_READY, (READY,), "False", NOW),
        (NodePhase.DISABLED, (READY.model_copy(update={"status": "False"}),), "False", EARLIER),
        (NodePhase.READY, (), "True", NOW),
    ],
    ids=[
        "ready_to_not_ready_moves_the_time",
        "not_ready_to_drained_is_a_reason_change_and_keeps_the_time",
        "first_ready_condition_is_stamped_now",
    ],
)
def test_ready_conditions_follow_the_phase(
    phase: NodePhase,
    current: tuple[Condition, ...],
    expected_status: str,
    expected_time: datetime,
) -> None:
    updated = ready_conditions(phase, current, NOW)
    assert updated is not None
    (ready,) = [c for c in updated if c.type == "Ready"]
    assert ready.status == expected_status
    assert ready.last_transition_time == expected_time


def test_ready_conditions_unchanged_is_none() -> None:
    current = ready_conditions(NodePhase.READY, (), NOW)
    assert current is not None
    assert ready_conditions(NodePhase.READY, current, NOW + timedelta(hours=1)) is None


def _fresh(phase: NodePhase) -> Condition:
    """The Ready condition ``phase`` calls for, as first written."""
    (ready,) = ready_conditions(phase, (), NOW) or ()
    return ready


_PHASES = [p for p in NodePhase if ready_conditions(p, (), NOW)]
_times = st.one_of(st.none(), st.sampled_from([EARLIER, NOW - timedelta(minutes=5)]))
_stored_ready = st.builds(
    Condition,
    type=st.just("Ready"),
    status=st.sampled_from(["True", "False", "Unknown"]),
    reason=st.sampled_from(["LeaseRenewed", "LeaseExpired", "Drained", "NeverRenewed", "Other"]),
    message=st.one_of(st.sampled_from([_fresh(p).message for p in _PHASES]), st.text(max_size=5)),
    last_transition_time=_times,
    observed_generation=st.one_of(st.none(), st.integers(min_value=1, max_value=3)),
)


@given(
    phase=st.sampled_from(_PHASES),
    ready=st.one_of(st.none(), _stored_ready),
    other_first=st.booleans(),
)
def test_ready_conditions_answer_what_set_condition_would(
    phase: NodePhase, ready: Condition | None, other_first: bool
) -> None:
    """The routine pass skips building the merged conditions when nothing would change:
    for any stored Ready condition the answer is the one ``set_condition`` gives."""
    current = tuple(c for c in ((OTHER, ready) if other_first else (ready, OTHER)) if c)
    want = _fresh(phase)
    new = Condition(type="Ready", status=want.status, reason=want.reason, message=want.message)
    merged = set_condition(current, new, NOW)
    assert ready_conditions(phase, current, NOW) == (None if merged == current else merged)
