"""The pool plan: keep replicas live members, replace ended ones, newest surplus first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.policy.pools import Member, PoolPlan, plan_pool

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def m(
    name: str, phase: str = "Running", age: int = 0, *, bound: bool = True, ended: int | None = None
) -> Member:
    """``age``: seconds after T0 it was created (bigger is newer); ``ended``: when it finished."""
    return Member(
        name=name,
        phase=phase,
        bound=bound,
        created_at=T0 + timedelta(seconds=age),
        finished_at=None if ended is None else T0 + timedelta(seconds=ended),
    )


@pytest.mark.parametrize(
    ("replicas", "history", "members", "expected"),
    [
        (3, 10, [], PoolPlan(3, (), (), running=0, pending=3, terminal=0)),
        (
            2,
            10,
            [m("a"), m("b", "Dead")],
            PoolPlan(1, (), (), running=1, pending=1, terminal=1),
        ),
        (
            3,
            10,
            [m("a"), m("b", "Stopped"), m("c", "Failed"), m("d", "Dead")],
            PoolPlan(2, (), (), running=1, pending=2, terminal=3),
        ),
        (
            1,
            10,
            [m("old", age=0), m("new", age=5), m("mid", age=3)],
            PoolPlan(0, ("new", "mid"), (), running=1, pending=0, terminal=0),
        ),
        (
            1,
            10,
            [
                m("run", age=9),
                m("sched", "Scheduled", age=1),
                m("pend", "Pending", age=0, bound=False),
            ],
            PoolPlan(0, ("pend", "sched"), (), running=1, pending=0, terminal=0),
        ),
        (
            0,
            10,
            [m("a"), m("b", "Dead")],
            PoolPlan(0, ("a",), (), running=0, pending=0, terminal=1),
        ),
        (
            1,
            1,
            [
                m("live"),
                m("d1", "Dead", ended=5),
                m("d2", "Dead", ended=1),
                m("d3", "Stopped", ended=9),
            ],
            PoolPlan(0, (), ("d2", "d1"), running=1, pending=0, terminal=1),
        ),
        (
            1,
            0,
            [m("live", "Scheduled"), m("d1", "Failed", age=4)],
            PoolPlan(0, (), ("d1",), running=0, pending=1, terminal=0),
        ),
        (
            2,
            10,
            [m("a"), m("b", "Pending", bound=True)],
            PoolPlan(0, (), (), running=1, pending=1, terminal=0),
        ),
    ],
    ids=[
        "empty_pool_creates_every_replica",
        "dead_member_is_replaced_and_kept_as_history",
        "stopped_failed_and_dead_members_all_count_as_ended",
        "scale_down_deletes_the_newest_first",
        "scale_down_prefers_unbound_pending_then_scheduled_over_running",
        "scale_to_zero_deletes_every_live_member",
        "history_beyond_the_limit_goes_oldest_finished_first",
        "history_limit_zero_collects_every_ended_member",
        "steady_pool_does_nothing",
    ],
)
def test_plan_pool(replicas: int, history: int, members: list[Member], expected: PoolPlan) -> None:
    assert plan_pool(replicas, history, members) == expected
