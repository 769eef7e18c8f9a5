"""The mass-failure guard: when most of the fleet is NotReady, nothing is marked Dead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from sandlot.api.node import NodePhase
from sandlot.policy.disruption import (
    FleetMember,
    FleetSummary,
    GuardSettings,
    guard_active,
    hold_reminder_due,
    next_hold_report,
    summarize_fleet,
)

R, N, D = NodePhase.READY, NodePhase.NOT_READY, NodePhase.DISABLED
DEFAULT = GuardSettings()
NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
WINDOW = DEFAULT.window


@pytest.mark.parametrize(
    ("total", "not_ready", "expected"),
    [
        (20, 11, True),  # 0.55 exactly
        (20, 10, False),  # 0.50, below
        (20, 12, True),  # 0.60, above
        (3, 2, True),  # 0.67 at min_nodes
        (3, 1, False),
        (3, 3, True),
        (2, 2, False),  # under min_nodes: one lost node is already half the fleet
        (1, 1, False),
        (0, 0, False),
        (100, 54, False),
        (100, 55, True),
    ],
    ids=[
        "holds_at_exactly_the_threshold",
        "does_not_hold_below_the_threshold",
        "holds_above_the_threshold",
        "holds_at_min_nodes_when_over_threshold",
        "does_not_hold_at_min_nodes_when_under_threshold",
        "holds_when_every_node_is_not_ready",
        "never_holds_under_min_nodes_even_when_all_not_ready",
        "never_holds_for_a_single_node",
        "never_holds_for_an_empty_fleet",
        "does_not_hold_one_node_below_threshold_of_a_hundred",
        "holds_at_threshold_of_a_hundred",
    ],
)
def test_guard_threshold(total: int, not_ready: int, expected: bool) -> None:
    assert guard_active(FleetSummary(total, not_ready), DEFAULT) is expected


@pytest.mark.parametrize(
    ("phases", "expected_summary", "expected_active"),
    [
        ([R, N, N, D, D, D, D], FleetSummary(3, 2), True),
        ([R, R, N, D, D, D, D, D], FleetSummary(3, 1), False),
        ([N, N, D], FleetSummary(2, 2), False),
        ([D, D, D], FleetSummary(0, 0), False),
        (["Ready", "NotReady", "NotReady"], FleetSummary(3, 2), True),
    ],
    ids=[
        "disabled_nodes_are_left_out_of_both_counts",
        "a_large_drain_does_not_look_like_an_outage",
        "disabled_nodes_do_not_lift_a_fleet_over_min_nodes",
        "an_all_disabled_fleet_never_holds",
        "phases_read_as_plain_strings_count_the_same",
    ],
)
def test_fleet_summary_excludes_disabled_nodes(
    phases: list[NodePhase | str], expected_summary: FleetSummary, expected_active: bool
) -> None:
    summary = summarize_fleet([FleetMember(p) for p in phases], NOW, WINDOW)
    assert summary == expected_summary
    assert guard_active(summary, DEFAULT) is expected_active


@pytest.mark.parametrize(
    ("fleet", "guard", "expected"),
    [
        (FleetSummary(10, 5), GuardSettings(disruption_threshold=0.5), True),
        (FleetSummary(10, 5), GuardSettings(disruption_threshold=0.51), False),
        (FleetSummary(10, 10), GuardSettings(disruption_threshold=1.0), True),
        (FleetSummary(10, 9), GuardSettings(disruption_threshold=1.0), False),
        (FleetSummary(4, 4), GuardSettings(min_nodes=5), False),
        (FleetSummary(1, 1), GuardSettings(min_nodes=1), True),
    ],
    ids=[
        "custom_threshold_holds_at_its_value",
        "custom_threshold_does_not_hold_below_its_value",
        "threshold_of_one_holds_only_when_all_are_down",
        "threshold_of_one_does_not_hold_with_one_node_up",
        "custom_min_nodes_disables_the_guard_for_smaller_fleets",
        "min_nodes_of_one_guards_even_a_single_node",
    ],
)
def test_guard_follows_its_settings(
    fleet: FleetSummary, guard: GuardSettings, expected: bool
) -> None:
    assert guard_active(fleet, guard) is expected


def _summary(phases: list[NodePhase]) -> FleetSummary:
    return summarize_fleet([FleetMember(p) for p in phases], NOW, WINDOW)


def test_hold_lifts_when_the_not_ready_fraction_drops() -> None:
    fleet = [N, N, N, N, R, R, R, R, R, R]  # 0.4
    assert not guard_active(_summary(fleet), DEFAULT)
    fleet[4:6] = [N, N]  # 0.6: the operator is likelier cut off
    assert guard_active(_summary(fleet), DEFAULT)
    fleet[0] = R  # 0.5: back under the threshold
    assert not guard_active(_summary(fleet), DEFAULT)


def test_nodes_handled_long_ago_leave_both_sides_so_a_new_failure_is_not_held() -> None:
    # Six nodes dead and handled 20 minutes ago, four healthy, one newly lost: counting
    # the past outage would make 7/11 NotReady and hold the new failure forever.
    healthy = [FleetMember(R) for _ in range(4)]
    lost = [FleetMember(N)]

    def handled(ago: timedelta) -> list[FleetMember]:
        return [FleetMember(N, handled_at=NOW - ago) for _ in range(6)]

    stale = summarize_fleet(handled(timedelta(minutes=20)) + healthy + lost, NOW, WINDOW)
    assert stale == FleetSummary(5, 1)
    assert not guard_active(stale, DEFAULT)
    # Handled within the window they are the present outage and still count.
    recent = summarize_fleet(handled(timedelta(minutes=5)) + healthy + lost, NOW, WINDOW)
    assert recent == FleetSummary(11, 7)
    assert guard_active(recent, DEFAULT)
    # Exactly at the window's edge a node still counts.
    assert summarize_fleet(handled(WINDOW) + healthy + lost, NOW, WINDOW) == FleetSummary(11, 7)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"disruption_threshold": 0.0}, "disruption_threshold"),
        ({"disruption_threshold": 1.5}, "disruption_threshold"),
        ({"disruption_threshold": -0.1}, "disruption_threshold"),
        ({"min_nodes": 0}, "min_nodes"),
        ({"min_nodes": 3, "surprise": 1}, "surprise"),
    ],
    ids=[
        "refuses_a_zero_threshold",
        "refuses_a_threshold_over_one",
        "refuses_a_negative_threshold",
        "refuses_min_nodes_below_one",
        "refuses_an_unknown_setting",
    ],
)
def test_guard_settings_refuse_bad_values_naming_the_field(
    kwargs: dict[str, float], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        GuardSettings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("total", "not_ready"),
    [(-1, 0), (2, 3), (2, -1)],
    ids=[
        "refuses_a_negative_total",
        "refuses_more_not_ready_than_total",
        "refuses_negative_not_ready",
    ],
)
def test_fleet_summary_refuses_impossible_counts(total: int, not_ready: int) -> None:
    with pytest.raises(ValueError):
        FleetSummary(total, not_ready)


EVERY = DEFAULT.report_every


@pytest.mark.parametrize(
    ("last", "now", "due"),
    [
        (None, NOW, True),
        (NOW, NOW + EVERY - timedelta(seconds=1), False),
        (NOW, NOW + EVERY, True),
        (NOW + EVERY, NOW + EVERY * 2 - timedelta(seconds=1), False),
        (NOW + EVERY + timedelta(seconds=30), NOW + EVERY * 2, True),
        (NOW - timedelta(seconds=5), NOW + timedelta(seconds=5), True),
        (NOW + EVERY * 3, NOW + EVERY * 3, False),
    ],
    ids=[
        "first_seen_held_is_said_at_once",
        "not_again_within_the_interval",
        "again_at_each_whole_interval",
        "not_twice_in_one_interval",
        "once_per_interval_however_late_the_last",
        "said_before_this_hold_began_is_said_for_it",
        "a_second_pass_at_the_same_moment_says_nothing",
    ],
)
def test_a_hold_is_reported_once_per_whole_interval(
    last: datetime | None, now: datetime, due: bool
) -> None:
    assert hold_reminder_due(NOW, last, now, EVERY) is due


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (NOW - timedelta(seconds=1), NOW),
        (NOW, NOW + EVERY),
        (NOW + EVERY * 2 + timedelta(seconds=5), NOW + EVERY * 3),
    ],
    ids=["before_the_hold_its_start", "at_the_start_one_interval_on", "the_next_whole_interval"],
)
def test_the_next_hold_report_is_the_next_whole_interval(now: datetime, expected: datetime) -> None:
    assert next_hold_report(NOW, now, EVERY) == expected
