"""When the woken loops run their next pass (``policy.syncpacing``), on a fake clock."""

from __future__ import annotations

import pytest

from sandlot.agent.settings import AgentSettings
from sandlot.policy.syncpacing import (
    Pacing,
    PassBudget,
    available,
    fail_pass,
    full_budget,
    next_pass_at,
    take_pass,
)

PACING = Pacing(interval=1.0, burst=3, longest=30.0)
T0 = 1000.0


@pytest.mark.parametrize(
    ("budget", "now", "woken", "expected"),
    [
        (full_budget(PACING, T0), T0, False, T0),
        (full_budget(PACING, T0), T0 + 5, True, T0 + 5),
        (PassBudget(tokens=2.0, counted_at=T0, last_pass=T0), T0 + 0.25, True, T0 + 0.25),
        (PassBudget(tokens=1.0, counted_at=T0, last_pass=T0), T0, True, T0),
        (PassBudget(tokens=0.0, counted_at=T0, last_pass=T0), T0, True, T0 + 1.0),
        (PassBudget(tokens=0.0, counted_at=T0, last_pass=T0), T0 + 0.75, True, T0 + 1.0),
        (PassBudget(tokens=0.5, counted_at=T0, last_pass=T0), T0, True, T0 + 0.5),
        (PassBudget(tokens=2.0, counted_at=T0, last_pass=T0), T0 + 1, False, T0 + 30),
        (PassBudget(tokens=0.0, counted_at=T0 + 29.5, last_pass=T0), T0 + 29.5, False, T0 + 30.5),
        (PassBudget(tokens=3.0, counted_at=T0, last_pass=T0), T0 + 31, False, T0 + 31),
    ],
    ids=[
        "first_pass_runs_at_once_unwoken",
        "lone_change_after_quiet_runs_at_once",
        "change_within_the_burst_runs_at_once",
        "last_pass_in_the_bucket_runs_at_once",
        "empty_bucket_waits_a_whole_interval",
        "empty_bucket_earns_its_pass_while_waiting",
        "half_a_pass_waits_half_an_interval",
        "idle_loop_waits_for_the_resync",
        "resync_waits_for_an_empty_bucket_to_earn_a_pass",
        "overdue_resync_runs_at_once",
    ],
)
def test_next_pass_at(budget: PassBudget, now: float, woken: bool, expected: float) -> None:
    assert next_pass_at(budget, PACING, now, woken=woken) == expected


@pytest.mark.parametrize(
    ("budget", "now", "expected"),
    [
        (PassBudget(tokens=0.0, counted_at=T0), T0 + 0.5, 0.5),
        (PassBudget(tokens=1.0, counted_at=T0), T0 + 1.5, 2.5),
        (PassBudget(tokens=0.0, counted_at=T0), T0 + 100, 3.0),
        (PassBudget(tokens=2.0, counted_at=T0), T0 - 1, 2.0),
    ],
    ids=[
        "earns_a_pass_per_interval",
        "adds_to_what_it_held",
        "never_beyond_burst",
        "clock_before_count",
    ],
)
def test_available(budget: PassBudget, now: float, expected: float) -> None:
    assert available(budget, PACING, now) == expected


def test_take_pass_spends_one_and_records_when_it_began() -> None:
    budget = take_pass(PassBudget(tokens=1.5, counted_at=T0), PACING, T0 + 0.5)
    assert budget == PassBudget(tokens=1.0, counted_at=T0 + 0.5, last_pass=T0 + 0.5)


def test_failed_pass_empties_the_bucket_so_the_retry_waits_one_interval() -> None:
    began = take_pass(full_budget(PACING, T0), PACING, T0)
    failed = fail_pass(began, T0 + 0.25)
    assert failed.last_pass == T0
    assert next_pass_at(failed, PACING, T0 + 0.25, woken=True) == T0 + 1.25


def run_loop(
    pacing: Pacing, changes: list[float], *, pass_seconds: float, until: float
) -> list[float]:
    """The start of every pass the woken loop makes for changes arriving at ``changes``.

    Each pass takes ``pass_seconds``; the wake-up is cleared when a pass begins,
    as the loop in ``agent.loops`` does, and a change during a pass wakes the next.
    """
    pending = sorted(changes)
    budget = full_budget(pacing, 0.0)
    now, woken, starts = 0.0, False, []
    budget = take_pass(budget, pacing, now)  # the first pass, at start-up
    starts.append(now)
    now += pass_seconds
    while now < until:
        while pending and pending[0] <= now:
            pending.pop(0)
            woken = True
        due = next_pass_at(budget, pacing, now, woken=woken)
        if due > now:
            now = min(due, pending[0]) if pending and not woken else due
            continue
        woken = False
        budget = take_pass(budget, pacing, now)
        starts.append(now)
        now += pass_seconds
    return starts


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ([5.0], [0.0, 5.0, 35.0]),
        ([5.0, 10.0, 15.0], [0.0, 5.0, 10.0, 15.0, 45.0]),
        ([5.0, 5.0, 5.0, 5.0], [0.0, 5.0, 35.0]),
        ([5.0 + i * 0.125 for i in range(10)], [0.0, 5.0, 5.125, 5.25, 6.0, 7.0, 37.0]),
    ],
    ids=[
        "lone_change_runs_at_once",
        "spaced_changes_each_run_at_once",
        "simultaneous_changes_share_one_pass",
        "burst_runs_at_once_then_at_the_sustained_rate",
    ],
)
def test_woken_loop_schedule(changes: list[float], expected: list[float]) -> None:
    assert run_loop(PACING, changes, pass_seconds=0.125, until=50.0) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0.0, "burst": 1, "longest": 1.0}, "interval must be > 0"),
        ({"interval": 1.0, "burst": 0, "longest": 1.0}, "burst must be >= 1"),
        ({"interval": 2.0, "burst": 1, "longest": 1.0}, "longest"),
    ],
    ids=["zero_interval", "zero_burst", "resync_shorter_than_interval"],
)
def test_bad_pacing_is_refused_naming_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pacing(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, Pacing(interval=0.2, burst=5, longest=30.0)),
        (
            {"sync_interval": "2s", "sync_burst": 1, "resync_interval": "1m"},
            Pacing(interval=2.0, burst=1, longest=60.0),
        ),
    ],
    ids=["defaults_allow_five_passes_a_second", "burst_of_one_is_one_pass_per_interval"],
)
def test_agent_settings_give_sync_burst_passes_per_sync_interval(
    settings: dict[str, object], expected: Pacing
) -> None:
    assert AgentSettings(node_name="n1", **settings).sync_pacing == expected  # type: ignore[arg-type]
