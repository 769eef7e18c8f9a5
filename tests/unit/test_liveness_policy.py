"""Liveness on the operator's clock: renewals observed as changes, never clocks compared."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.policy.liveness import (
    LeaseView,
    LeaseViewState,
    first_seen_at,
    from_wall,
    lease_expiry,
    observe_renewal,
    observed_phase,
    reap_blocked_until,
    to_wall,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
UNSEEN = timedelta(seconds=60)
R, N, D = NodePhase.READY, NodePhase.NOT_READY, NodePhase.DISABLED


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def seen(renew: str, at: datetime, holder: str = "agent-a", duration: int = 60) -> ObservedRenewal:
    return ObservedRenewal(
        renew_time=renew, holder_identity=holder, observed_at=at, lease_duration_seconds=duration
    )


def lease(renew: str | None, holder: str | None = "agent-a", duration: int = 60) -> LeaseView:
    return LeaseView(renew_time=renew, holder=holder, duration_seconds=duration)


EARLIER = seen("2029-12-31T23:50:00.000000Z", NOW - s(30))
RECORDED = seen("2029-12-31T23:40:00.000000Z", NOW - s(500))


@pytest.mark.parametrize(
    ("previous", "read", "recorded", "expected"),
    [
        (EARLIER, lease("2029-12-31T23:50:00.000000Z"), None, EARLIER),
        (EARLIER, lease("2029-12-31T23:50:10.000000Z"), None, seen("2029-12-31T23:50:10.000000Z", NOW)),
        (EARLIER, lease("2029-12-31T23:50:00.000000Z", holder="agent-b"), None,
         seen("2029-12-31T23:50:00.000000Z", NOW, holder="agent-b")),
        (EARLIER, lease("2000-01-01T00:00:00.000000Z"), None, seen("2000-01-01T00:00:00.000000Z", NOW)),
        (EARLIER, None, None, EARLIER),
        (None, None, RECORDED, RECORDED),
        (None, lease("2029-12-31T23:40:00.000000Z"), RECORDED, RECORDED),
        (None, lease("2029-12-31T23:40:05.000000Z"), RECORDED, seen("2029-12-31T23:40:05.000000Z", NOW)),
        (None, lease("2029-12-31T23:40:00.000000Z"), None, seen("2029-12-31T23:40:00.000000Z", NOW)),
        (None, lease(None), None, None),
        (EARLIER, lease(None), None, EARLIER),
        (None, None, None, None),
    ],
    ids=[
        "unchanged_lease_keeps_the_time_it_was_first_seen",
        "changed_renew_time_is_a_renewal_timed_now",
        "changed_holder_is_a_renewal",
        "a_renew_time_in_the_agents_past_still_counts_as_a_change",
        "deleted_lease_keeps_the_last_observed_renewal",
        "deleted_lease_after_a_restart_keeps_the_recorded_renewal",
        "restart_finding_the_recorded_lease_unchanged_keeps_its_time",
        "restart_finding_a_newer_lease_counts_it_renewed_now",
        "restart_without_a_record_counts_the_lease_renewed_now",
        "a_lease_never_renewed_proves_nothing",
        "a_lease_without_renew_time_keeps_the_last_renewal",
        "nothing_seen_nothing_recorded",
    ],
)  # fmt: skip
def test_observe_renewal(
    previous: ObservedRenewal | None,
    read: LeaseView | None,
    recorded: ObservedRenewal | None,
    expected: ObservedRenewal | None,
) -> None:
    assert observe_renewal(previous, read, recorded, NOW) == expected


@pytest.mark.parametrize(
    ("unschedulable", "renewal", "first_seen", "expected"),
    [
        (False, seen("a", NOW - s(59)), NOW - s(3600), R),
        (False, seen("a", NOW - s(60)), NOW - s(3600), N),
        (False, seen("a", NOW - s(14), duration=15), NOW - s(3600), R),
        (False, seen("a", NOW, duration=0), NOW - s(3600), N),
        (True, seen("a", NOW), NOW, D),
        (False, None, NOW - s(59), R),
        (False, None, NOW - s(60), N),
    ],
    ids=[
        "ready_within_the_duration_after_the_observed_renewal",
        "not_ready_at_exactly_observed_plus_duration",
        "uses_the_leases_own_duration",
        "zero_duration_is_never_ready",
        "drained_is_disabled_even_with_a_fresh_renewal",
        "never_renewed_is_ready_for_one_duration_after_first_seen",
        "never_renewed_is_not_ready_one_duration_after_first_seen",
    ],
)
def test_observed_phase(
    unschedulable: bool, renewal: ObservedRenewal | None, first_seen: datetime, expected: NodePhase
) -> None:
    assert observed_phase(unschedulable, renewal, first_seen, UNSEEN, NOW) is expected
    if not unschedulable:
        expiry = lease_expiry(renewal, first_seen, UNSEEN)
        assert (expiry > NOW) is (expected is R)


@pytest.mark.parametrize(
    ("tracking", "expected"),
    [
        (NodeHealthTracking(), NOW),
        (NodeHealthTracking(unhealthy_since=NOW - s(100)), NOW - s(160)),
        (NodeHealthTracking(unhealthy_since=NOW - s(100), last_renewal=RECORDED), NOW),
        (NodeHealthTracking(unhealthy_since=NOW + s(100)), NOW),
    ],
    ids=[
        "a_node_met_for_the_first_time_is_first_seen_now",
        "an_episode_without_a_renewal_implies_its_first_sighting",
        "an_episode_after_a_renewal_is_timed_by_the_renewal",
        "never_later_than_now",
    ],
)
def test_first_seen_at(tracking: NodeHealthTracking, expected: datetime) -> None:
    assert first_seen_at(tracking, NOW, UNSEEN) == expected


BOUND = s(45)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (LeaseViewState(since=None, last_heard=None), NOW + BOUND),
        (LeaseViewState(since=NOW - s(3600), last_heard=NOW - s(1)), None),
        (LeaseViewState(since=NOW - s(3600), last_heard=NOW - s(45)), None),
        (LeaseViewState(since=NOW - s(3600), last_heard=NOW - s(46)), NOW + BOUND),
        (LeaseViewState(since=NOW - s(10), last_heard=NOW), NOW + s(50)),
        (LeaseViewState(since=NOW - s(60), last_heard=NOW), None),
    ],
    ids=[
        "never_established_blocks",
        "fresh_continuous_view_allows",
        "heard_exactly_at_the_bound_allows",
        "silent_longer_than_the_bound_blocks",
        "just_re_established_waits_one_lease_duration",
        "re_established_one_lease_duration_ago_allows",
    ],
)
def test_reap_blocked_until(state: LeaseViewState, expected: datetime | None) -> None:
    assert reap_blocked_until(state, s(60), BOUND, NOW) == expected


# -- the status boundary: steady moments <-> wall-clock moments ---------------------------

WALL_AHEAD = s(600)  # the wall clock reads 10 minutes later than the steady one


def test_a_moment_goes_to_the_wall_clock_and_back_unchanged() -> None:
    moment = NOW - s(42)
    wall = to_wall(moment, NOW, NOW + WALL_AHEAD)
    assert wall == moment + WALL_AHEAD
    assert from_wall([wall], NOW, NOW + WALL_AHEAD) == [moment]


BEHIND = NOW - s(600)  # a wall clock stepped back 10 minutes since the steady one began


@pytest.mark.parametrize(
    ("recorded", "wall_now", "expected"),
    [
        ([NOW - s(70), NOW - s(10)], NOW, [NOW - s(70), NOW - s(10)]),
        ([BEHIND - s(70), BEHIND - s(10)], BEHIND, [NOW - s(70), NOW - s(10)]),
        ([NOW + s(50), NOW + s(110)], NOW, [NOW - s(60), NOW]),
        ([], NOW, []),
    ],
    ids=[
        "same_clocks_translate_as_is",
        "the_age_on_the_wall_clock_is_the_age_on_the_steady_clock",
        "moments_later_than_now_move_back_together_until_the_latest_is_now",
        "nothing_recorded",
    ],
)
def test_from_wall(recorded: list[datetime], wall_now: datetime, expected: list[datetime]) -> None:
    assert from_wall(recorded, NOW, wall_now) == expected
