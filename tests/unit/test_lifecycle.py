"""The lifecycle table (``policy.lifecycle``) and what the loops ask of it: a frozen
task no record explains is thawed by the sync (and only then), the idle loop's
freeze holds the sandbox's work slot, and the docs show the table itself."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from sandlot.agent.workpools import SandboxPools
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import Action, ActionKind, SandboxState, plan_sync, thaw_stands
from sandlot.policy.lifecycle import STEPS, Step, invariants_list, steps_table, thaw_due
from sandlot.policy.operatingmode import TaskState

M, T = OperatingMode, TaskState
KEY, CID = "ns/box", "sb-uid-1"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"

# (mode, task, recorded paused, idle paused, suspended, busy) -> thaw due
THAW = {
    "frozen-running-spec-nothing-recorded": (M.RUNNING, T.PAUSED, False, False, False, False, True),
    "still-freezing-nothing-recorded": (M.RUNNING, T.PAUSING, False, False, False, False, True),
    "running-task-is-fine": (M.RUNNING, T.RUNNING, False, False, False, False, False),
    "task-not-read": (M.RUNNING, None, False, False, False, False, False),
    "stopped-task-is-the-reapers": (M.RUNNING, T.STOPPED, False, False, False, False, False),
    "spec-asks-paused": (M.PAUSED, T.PAUSED, False, False, False, False, False),
    "spec-asks-suspended-commit-freezes": (
        M.SUSPENDED,
        T.PAUSED,
        False,
        False,
        False,
        False,
        False,
    ),
    "pause-recorded-the-mode-rows-resume-it": (
        M.RUNNING,
        T.PAUSED,
        True,
        False,
        False,
        False,
        False,
    ),
    "idle-pause-recorded": (M.RUNNING, T.PAUSED, True, True, False, False, False),
    "suspension-recorded": (M.RUNNING, T.PAUSED, False, False, True, False, False),
    "a-step-holds-the-slot": (M.RUNNING, T.PAUSED, False, False, False, True, False),
}


@pytest.mark.parametrize(
    ("mode", "task", "paused", "idle", "suspended", "busy", "due"), THAW.values(), ids=list(THAW)
)
def test_thaw_due(
    mode: OperatingMode,
    task: TaskState | None,
    paused: bool,
    idle: bool,
    suspended: bool,
    busy: bool,
    due: bool,
) -> None:
    decided = thaw_due(
        mode, task, recorded_paused=paused, idle_paused=idle, suspended=suspended, busy=busy
    )
    assert decided is due


def running(**fields: object) -> SandboxState:
    return replace(SandboxState(KEY, SandboxPhase.RUNNING, CID), **fields)  # type: ignore[arg-type]


def listed(task: TaskState | None) -> ContainerView:
    return ContainerView(CID, {SANDBOX_LABEL: KEY}, task)


THAW_ACTION = [Action(ActionKind.THAW, KEY, CID)]
ROWS = {
    # (sandbox, task listed, drained, in flight) -> actions
    "frozen-nothing-recorded-is-thawed": (running(), T.PAUSED, False, (), THAW_ACTION),
    "frozen-but-a-step-is-in-flight": (running(), T.PAUSED, False, (KEY,), []),
    "frozen-and-idle-recorded-waits-for-use": (
        running(paused=True, idle_paused=True),
        T.PAUSED,
        False,
        (),
        [],
    ),
    "frozen-recorded-paused-spec-running-applies-mode": (
        running(paused=True),
        T.PAUSED,
        False,
        (),
        [Action(ActionKind.APPLY_MODE, KEY, CID)],
    ),
    "frozen-spec-paused-unrecorded-records-it": (
        running(mode=M.PAUSED),
        T.PAUSED,
        False,
        (),
        [Action(ActionKind.APPLY_MODE, KEY, CID)],
    ),
    "frozen-on-a-drained-node-is-stopped-not-thawed": (
        running(),
        T.PAUSED,
        True,
        (),
        [Action(ActionKind.STOP_DRAINED, KEY, CID)],
    ),
    "running-task-nothing-to-do": (running(), T.RUNNING, False, (), []),
    "task-unlisted-nothing-to-do": (running(), None, False, (), []),
}


@pytest.mark.parametrize(
    ("sb", "task", "drained", "in_flight", "expected"), ROWS.values(), ids=list(ROWS)
)
def test_plan_sync_thaws_a_frozen_task_nothing_records(
    sb: SandboxState,
    task: TaskState | None,
    drained: bool,
    in_flight: tuple[str, ...],
    expected: list[Action],
) -> None:
    assert plan_sync([sb], [listed(task)], drained=drained, in_flight=in_flight) == expected


@pytest.mark.parametrize(
    ("fresh", "task", "stands"),
    [
        (running(), T.PAUSED, True),
        (running(paused=True, idle_paused=True), T.PAUSED, False),  # recorded since
        (running(), T.RUNNING, False),  # thawed since (a stream)
        (running(mode=M.PAUSED), T.PAUSED, False),  # the spec asks for it now
        (replace(running(), phase=SandboxPhase.STOPPED), T.PAUSED, False),
    ],
    ids=["still-unrecorded", "idle-recorded-since", "thawed-since", "spec-paused-now", "ended"],
)
def test_a_thaw_stands_only_on_a_fresh_read_that_agrees(
    fresh: SandboxState, task: TaskState, stands: bool
) -> None:
    assert thaw_stands(fresh, task) is stands


def test_a_loop_holding_a_slot_in_place_excludes_queued_work_and_the_other_way_round() -> None:
    stop, done = threading.Event(), threading.Event()
    pools = SandboxPools(1, 1, stop, done)
    ran = threading.Event()
    release = threading.Event()
    try:
        with pools.holding(KEY) as held:
            assert held
            assert pools.busy(KEY)
            assert not pools.submit(KEY, ran.set), "work queued under a hold"
            assert not pools.submit(KEY, ran.set, graceful=True), "a stop queued under a hold"
        assert not pools.busy(KEY) and done.is_set(), "the hold's end wakes the passes"
        assert pools.submit(KEY, release.wait, graceful=True)
        with pools.holding(KEY) as held:
            assert not held, "held in place while a graceful stop runs"
        release.set()
        assert not ran.is_set()
    finally:
        release.set()
        pools.shutdown()


def test_every_step_has_a_rule_and_the_docs_show_the_table_and_the_invariants() -> None:
    assert [rule.step for rule in STEPS] == list(Step)
    docs = DOCS.read_text()
    assert steps_table() in docs, "docs/lifecycle.md does not show policy.lifecycle.STEPS"
    assert invariants_list() in docs, "docs/lifecycle.md does not list the invariants"
