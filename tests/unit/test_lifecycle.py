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
from sandlot.policy.lifecycle import (
    STEPS,
    Held,
    LeftBehind,
    Step,
    held_here,
    invariants_list,
    left_behind,
    logs_kept,
    probed,
    reaper_leaves,
    steps_table,
    thaw_due,
)
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


NODE = "n1"


def body(
    phase: str | None = "Running",
    mode: str = "Running",
    *conditions: tuple[str, str, str],
    node: str = NODE,
) -> dict[str, object]:
    status: dict[str, object] = {
        "conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conditions]
    }
    if phase is not None:
        status["phase"] = phase
    return {
        "metadata": {"namespace": "ns", "name": "box", "uid": "u1"},
        "spec": {"nodeName": node, "operatingMode": mode},
        "status": status,
    }


SUSPENDED_IDLE = ("Suspended", "True", "Idle")
HELD = {
    # body -> what this node holds of it
    "gone": (None, Held.NOTHING),
    "another-nodes": (body(node="n2"), Held.NOTHING),
    "ended": (body("Stopped"), Held.NOTHING),
    "lost": (body("Dead"), Held.NOTHING),
    "bound-not-started": (body(None), Held.STARTING),
    "scheduled": (body("Scheduled"), Held.STARTING),
    "running": (body(), Held.RUNNING),
    "restored": (body("Running", "Running", ("Suspended", "False", "Restored")), Held.RUNNING),
    "spec-paused": (body("Running", "Paused"), Held.FROZEN),
    "idle-paused": (body("Running", "Running", ("Paused", "True", "Idle")), Held.FROZEN),
    "suspend-asked-commit-ahead": (body("Running", "Suspended"), Held.FROZEN),
    "suspended": (
        body("Running", "Suspended", ("Suspended", "True", "Suspended")),
        Held.SUSPENDED,
    ),
    "idle-suspended": (body("Running", "Running", SUSPENDED_IDLE), Held.SUSPENDED),
    "paused-then-suspended": (
        body("Running", "Suspended", ("Paused", "True", "Paused"), SUSPENDED_IDLE),
        Held.SUSPENDED,
    ),
}


@pytest.mark.parametrize(("obj", "held"), HELD.values(), ids=list(HELD))
def test_held_here(obj: dict[str, object] | None, held: Held) -> None:
    assert held_here(obj, NODE) is held


# held -> (its logs stay, probed when no step holds it, the reaper leaves it)
LOOPS = {
    Held.NOTHING: (False, False, False),
    Held.STARTING: (True, False, False),
    Held.RUNNING: (True, True, False),
    Held.FROZEN: (True, False, False),
    Held.SUSPENDED: (True, False, True),
}


@pytest.mark.parametrize("held", list(LOOPS), ids=str)
def test_what_each_loop_does_with_what_the_node_holds(held: Held) -> None:
    """logs: a suspended sandbox's logs stay; kept-suspended: the reaper leaves a
    suspended one; the prober probes only a task that runs, and none a step holds."""
    logs, probe, leaves = LOOPS[held]
    assert (logs_kept(held), probed(held, busy=False), reaper_leaves(held)) == (
        logs,
        probe,
        leaves,
    )
    assert not probed(held, busy=True)


def test_every_step_has_a_rule_and_the_docs_show_the_table_and_the_invariants() -> None:
    assert [rule.step for rule in STEPS] == list(Step)
    docs = DOCS.read_text()
    assert steps_table() in docs, "docs/lifecycle.md does not show policy.lifecycle.STEPS"
    assert invariants_list() in docs, "docs/lifecycle.md does not list the invariants"


@pytest.mark.parametrize(
    ("task", "what"),
    [
        (T.RUNNING, LeftBehind.ADOPT),
        (T.PAUSED, LeftBehind.THAW),
        (T.PAUSING, LeftBehind.THAW),
        (T.STOPPED, LeftBehind.REMOVE),
        (T.CREATED, LeftBehind.REMOVE),
        (None, LeftBehind.REMOVE),
        (T.UNKNOWN, LeftBehind.WAIT),
    ],
    ids=["runs", "frozen", "freezing", "killed", "never-started", "no-task", "silent-shim"],
)
def test_left_behind(task: TaskState | None, what: LeftBehind) -> None:
    assert left_behind(task) is what
