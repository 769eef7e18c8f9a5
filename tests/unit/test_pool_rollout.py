"""Rolling a pool's members onto a new template within maxSurge/maxUnavailable,
and backing off from members that keep failing: the pure decision, table-driven."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.policy.pools import Backoff, Member, Rollout, decide_pool, rollout_progress, scaled

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def m(
    name: str,
    phase: str = "Running",
    age: int = 0,
    *,
    current: bool = True,
    ended: int | None = None,
    reason: str | None = None,
    exit_code: int | None = None,
) -> Member:
    return Member(
        name=name,
        phase=phase,
        bound=phase != "Pending",
        created_at=T0 + timedelta(seconds=age),
        finished_at=None if ended is None else T0 + timedelta(seconds=ended),
        current=current,
        reason=reason,
        exit_code=exit_code,
    )


def old(n: int, phase: str = "Running") -> list[Member]:
    return [m(f"old{i}", phase, age=i, current=False) for i in range(n)]


@pytest.mark.parametrize(
    ("value", "replicas", "up", "expected"),
    [
        ("25%", 4, True, 1),
        ("25%", 5, True, 2),
        ("25%", 5, False, 1),
        (3, 10, True, 3),
        ("0%", 9, True, 0),
    ],
    ids=[
        "quarter_of_four",
        "surge_rounds_up",
        "unavailable_rounds_down",
        "a_count_is_a_count",
        "zero_percent",
    ],
)
def test_scaled(value: int | str, replicas: int, up: bool, expected: int) -> None:
    assert scaled(value, replicas, round_up=up) == expected


# (replicas, rollout, members) -> (create, deleted, updated, ready)
ROLL = {
    "first_step_adds_one_and_removes_one_old": (
        4,
        Rollout(),
        old(4),
        (1, ("old3",), 1, 3),
    ),
    "new_member_not_running_yet_holds_further_removals": (
        4,
        Rollout(),
        [*old(3), m("new0", "Scheduled", age=9)],
        (1, (), 2, 3),
    ),
    "surge_room_used_up_nothing_created": (
        4,
        Rollout(),
        [*old(3), m("new0", age=9), m("new1", "Pending", age=10)],
        (0, ("old2",), 2, 3),
    ),
    "unready_old_members_go_first": (
        4,
        Rollout(),
        [*old(3), m("oldp", "Pending", age=1, current=False)],
        (1, ("oldp",), 1, 3),
    ),
    "max_unavailable_zero_only_surges": (
        2,
        Rollout(max_surge=1, max_unavailable=0),
        old(2),
        (1, (), 1, 2),
    ),
    "both_zero_surges_by_one": (
        2,
        Rollout(max_surge=0, max_unavailable=0),
        old(2),
        (1, (), 1, 2),
    ),
    "all_at_once_with_full_surge": (
        2,
        Rollout(max_surge="100%", max_unavailable="100%"),
        old(2),
        (2, ("old1", "old0"), 2, 0),
    ),
    "last_old_member_goes_once_the_new_ones_run": (
        3,
        Rollout(max_surge=1, max_unavailable=0),
        [m("old0", current=False), m("new0", age=5), m("new1", age=6), m("new2", age=7)],
        (0, ("old0",), 3, 3),
    ),
    "no_template_change_is_a_steady_pool": (
        3,
        Rollout(),
        [m("a"), m("b", age=1), m("c", age=2)],
        (0, (), 3, 3),
    ),
}


@pytest.mark.parametrize("row", list(ROLL.values()), ids=list(ROLL))
def test_rolling_update(
    row: tuple[int, Rollout, list[Member], tuple[int, tuple[str, ...], int, int]],
) -> None:
    replicas, rollout, members, (create, deleted, updated, ready) = row
    decision = decide_pool(replicas, 10, members, rollout=rollout)
    assert (decision.plan.create, decision.plan.delete) == (create, deleted)
    assert (decision.updated, decision.ready) == (updated, ready)
    live = sum(1 for x in members if not x.terminal)
    surge = scaled(rollout.max_surge, replicas, round_up=True) or 1
    assert live + create <= replicas + max(surge, 1), "never above replicas + maxSurge"


def test_rollout_converges_step_by_step_within_its_bounds() -> None:
    """Members start at once in this world: each step applies the plan and the new
    ones run; the pool ends all new, never above 5 live or below 3 Running."""
    members = old(4)
    seq = 0
    for _ in range(12):
        d = decide_pool(4, 10, members, rollout=Rollout())
        members = [x for x in members if x.name not in d.plan.delete]
        assert sum(1 for x in members if x.phase == "Running") >= 3
        for _ in range(d.plan.create):
            seq += 1
            members.append(m(f"new{seq}", age=100 + seq))
        assert len(members) <= 5
        if all(x.current for x in members) and len(members) == 4:
            break
    assert all(x.current for x in members) and len(members) == 4


CRASH: dict[str, Any] = {"reason": "Exited", "exit_code": 1}
BACKOFF = {
    "one_failure_waits_ten_seconds": (
        [m("f1", "Failed", ended=0)],
        5,
        (0, 1, T0 + timedelta(seconds=10)),
    ),
    "after_the_wait_it_replaces": (
        [m("f1", "Failed", ended=0)],
        10,
        (1, 1, None),
    ),
    "three_in_a_row_wait_forty_seconds": (
        [
            m("f1", "Failed", ended=0),
            m("f2", "Stopped", age=1, ended=10, **CRASH),
            m("f3", "Failed", age=2, ended=20),
        ],
        30,
        (0, 3, T0 + timedelta(seconds=60)),
    ),
    "the_wait_is_capped": (
        [m(f"f{i}", "Failed", age=i, ended=i) for i in range(9)],
        200,
        (0, 9, T0 + timedelta(seconds=8 + 300)),
    ),
    "a_clean_exit_breaks_the_chain": (
        [
            m("f1", "Failed", ended=0),
            m("ok", "Stopped", age=1, ended=5, reason="Exited", exit_code=0),
        ],
        6,
        (1, 0, None),
    ),
    "a_newer_member_running_resets_it": (
        [m("f1", "Failed", ended=0), m("runs", "Running", age=3)],
        1,
        (1, 0, None),
    ),
    "deadline_and_drain_are_not_failures": (
        [
            m("d1", "Stopped", ended=0, reason="DeadlineExceeded"),
            m("d2", "Stopped", age=1, ended=1, reason="Drained", exit_code=143),
        ],
        2,
        (1, 0, None),
    ),
}


@pytest.mark.parametrize("row", list(BACKOFF.values()), ids=list(BACKOFF))
def test_backoff(row: tuple[list[Member], int, tuple[int, int, datetime | None]]) -> None:
    members, at, (create, failures, until) = row
    replicas = 1 + sum(1 for x in members if not x.terminal)
    d = decide_pool(replicas, 10, members, backoff=Backoff(), now=T0 + timedelta(seconds=at))
    assert (d.plan.create, d.failures, d.backoff_until) == (create, failures, until)


def test_failures_that_set_the_backoff_are_kept_past_the_history_limit() -> None:
    members = [
        m("f1", "Failed", ended=0),
        m("f2", "Failed", age=1, ended=1),
        m("ok", "Stopped", age=-5, ended=-1),
    ]
    d = decide_pool(1, 0, members, backoff=Backoff(), now=T0 + timedelta(seconds=2))
    assert d.plan.collect == ("ok",)
    assert d.failures == 2


@pytest.mark.parametrize(
    ("generation", "status", "done", "says"),
    [
        (2, {"observedGeneration": 1}, False, "spec update to be observed"),
        (2, {"observedGeneration": 2, "updatedReplicas": 1, "running": 4}, False, "1 out of 4 new"),
        (
            2,
            {"observedGeneration": 2, "updatedReplicas": 4, "running": 4, "pending": 1},
            False,
            "1 old members are pending termination",
        ),
        (
            2,
            {
                "observedGeneration": 2,
                "updatedReplicas": 4,
                "readyReplicas": 3,
                "running": 3,
                "pending": 1,
            },
            False,
            "3 of 4 updated members are Running",
        ),
        (
            2,
            {"observedGeneration": 2, "updatedReplicas": 4, "readyReplicas": 4, "running": 4},
            True,
            'pool "web" successfully rolled out',
        ),
    ],
    ids=["not_observed_yet", "creating_new", "old_left", "new_not_running", "done"],
)
def test_rollout_progress(generation: int, status: dict[str, int], done: bool, says: str) -> None:
    progress = rollout_progress("web", generation, 4, status)
    assert progress.done is done
    assert says in progress.message


def _simulate_crashing_rollout(min_ready: timedelta, seconds: int = 180) -> tuple[int, int]:
    """Replicas 4, maxUnavailable 1: the new template's command exits 1 three seconds
    after it starts. Each new member starts Running a second after it is created.
    Returns (fewest Running members seen after the rollout began, members created)."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    members: dict[str, Member] = {
        f"old{i}": Member(
            f"old{i}",
            "Running",
            True,
            t0 - timedelta(hours=1),
            current=False,
            ready_since=t0 - timedelta(hours=1),
        )
        for i in range(4)
    }
    made = 0
    fewest = 4
    rollout = Rollout(max_surge=1, max_unavailable=1)
    for step in range(seconds):
        now = t0 + timedelta(seconds=step)
        for name, m in list(members.items()):  # the members' own lives
            if m.current and m.phase == "Pending" and now - m.created_at >= timedelta(seconds=1):
                members[name] = replace(m, phase="Running", ready_since=now)
            elif (
                m.current
                and m.ready_since is not None
                and now - m.ready_since >= timedelta(seconds=3)
                and m.phase == "Running"
            ):
                members[name] = replace(
                    m, phase="Stopped", reason="Exited", exit_code=1, finished_at=now
                )
        decision = decide_pool(
            4, 10, members.values(), rollout=rollout, backoff=Backoff(), now=now,
            min_ready=min_ready,
        )  # fmt: skip
        for name in decision.plan.delete:
            del members[name]
        for _ in range(decision.plan.create):
            made += 1
            members[f"new{made}"] = Member(f"new{made}", "Pending", False, now)
        fewest = min(fewest, sum(1 for m in members.values() if m.phase == "Running"))
    return fewest, made


@pytest.mark.parametrize(
    "min_ready",
    [timedelta(seconds=5), timedelta(seconds=60)],
    ids=["min_ready_5s", "min_ready_60s_past_the_backoff_cap"],
)
def test_a_crashing_template_never_takes_running_members_below_replicas_minus_unavailable(
    min_ready: timedelta,
) -> None:
    fewest, made = _simulate_crashing_rollout(min_ready)
    assert made >= 2, "the rollout never started: the bound below would prove nothing"
    assert fewest >= 4 - 1, f"Running members dropped to {fewest}"


def test_a_member_on_a_not_ready_node_or_not_yet_min_ready_is_not_available() -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    m = Member("a", "Running", True, t0, ready_since=t0)
    five = timedelta(seconds=5)
    assert not m.available(t0 + timedelta(seconds=4), five)
    assert m.available(t0 + five, five)
    assert not replace(m, node_ready=False).available(t0 + five, five)
    assert not replace(m, phase="Pending").available(t0 + five, timedelta(0))


def test_the_failure_backoff_stops_old_members_deletes_not_only_creates() -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    old = [
        Member(f"old{i}", "Running", True, t0 - timedelta(hours=1), current=False) for i in range(4)
    ]
    crashed = Member("new1", "Stopped", True, t0 - timedelta(seconds=5), t0 - timedelta(seconds=1),
                     reason="Exited", exit_code=1)  # fmt: skip
    runner = Member("new2", "Running", True, t0 - timedelta(seconds=3), ready_since=t0)
    d = decide_pool(4, 10, [*old, crashed], rollout=Rollout(1, 1), backoff=Backoff(), now=t0)
    assert d.backoff_until is not None, "no back-off in force: the check below proves nothing"
    assert d.plan.create == 0 and d.plan.delete == ()
    d = decide_pool(4, 10, [*old, runner], rollout=Rollout(1, 1), backoff=Backoff(), now=t0)
    assert d.plan.delete, "without a back-off the rollout deletes an old member"
