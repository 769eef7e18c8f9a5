"""Pausing and resuming sandboxes: the pure decisions of ``policy.operatingmode``, the
sync rows they add, and the agent's work and stop against the in-memory runtime."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from sandlot.adapters.runtime import RuntimeError_, TaskState
from sandlot.agent.modes import ModeChanges
from sandlot.agent.status import StatusWriter
from sandlot.agent.teardown import stop, teardown
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import OperatingMode, SandboxPhase, SandboxSpec
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import (
    Action,
    ActionKind,
    SandboxState,
    mode_asked,
    plan_mode_change,
    plan_sync,
)
from sandlot.policy.capacity import Capacity
from sandlot.policy.conditions import parse_conditions, set_condition
from sandlot.policy.operatingmode import (
    ModeStep,
    decide_mode,
    mode_call,
    mode_outcome,
    mode_pending,
    paused_condition,
    stream_refusal,
)
from sandlot.policy.startrefusals import StartFacts
from tests.support.agent import FakeRuntime
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

M = OperatingMode
T = TaskState
KEY, CID, NODE = "ns/box", "sb-uid-1", "node-a"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


# ---------------------------------------------------------------- the API model


def test_mode_defaults_to_running_and_takes_paused_and_suspended() -> None:
    assert SandboxSpec(image="busybox").operating_mode == M.RUNNING
    for mode in ("Paused", "Suspended"):
        assert SandboxSpec.model_validate({"image": "b", "operatingMode": mode}).operating_mode
    with pytest.raises(ValidationError, match=r"operating_?[mM]ode"):
        SandboxSpec.model_validate({"image": "b", "operatingMode": "Hibernating"})


# ---------------------------------------------------------------- decide_mode

DECISIONS = {
    "pause-a-running-task": (M.PAUSED, T.RUNNING, ModeStep.PAUSE),
    "paused-task-only-recorded": (M.PAUSED, T.PAUSED, ModeStep.RECORD),
    "freezing-task-waits": (M.PAUSED, T.PAUSING, ModeStep.WAIT),
    "resume-a-paused-task": (M.RUNNING, T.PAUSED, ModeStep.RESUME),
    "resume-a-freezing-task": (M.RUNNING, T.PAUSING, ModeStep.RESUME),
    "running-task-only-recorded": (M.RUNNING, T.RUNNING, ModeStep.RECORD),
    "stopped-task-left-to-the-reaper": (M.PAUSED, T.STOPPED, ModeStep.LEAVE),
    "unknown-task-left-alone": (M.PAUSED, T.UNKNOWN, ModeStep.LEAVE),
    "created-task-left-alone": (M.RUNNING, T.CREATED, ModeStep.LEAVE),
    "no-task-left-alone": (M.PAUSED, None, ModeStep.LEAVE),
}


@pytest.mark.parametrize(("mode", "task", "step"), DECISIONS.values(), ids=list(DECISIONS))
def test_decide_mode(mode: OperatingMode, task: TaskState | None, step: ModeStep) -> None:
    assert decide_mode(mode, task) is step


PENDING = {
    "paused-wanted-not-recorded": (M.PAUSED, False, False, True),
    "paused-wanted-and-recorded": (M.PAUSED, True, False, False),
    "running-wanted-while-recorded-paused": (M.RUNNING, True, False, True),
    "running-wanted-never-paused": (M.RUNNING, False, False, False),
    "failed-pause-of-this-spec-not-retried": (M.PAUSED, False, True, False),
    "failed-resume-of-this-spec-not-retried": (M.RUNNING, True, True, False),
}


@pytest.mark.parametrize(
    ("mode", "paused", "failed", "pending"), PENDING.values(), ids=list(PENDING)
)
def test_mode_pending(mode: OperatingMode, paused: bool, failed: bool, pending: bool) -> None:
    assert mode_pending(mode, paused, failed) is pending


# ---------------------------------------------------------------- reading a Sandbox


def body(
    mode: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    generation: int = 3,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": "busybox", "nodeName": NODE}
    if mode is not None:
        spec["operatingMode"] = mode
    return {
        "metadata": {"namespace": "ns", "name": "box", "uid": "uid-1", "generation": generation},
        "spec": spec,
        "status": {"phase": phase, "containerId": CID, "conditions": conditions or []},
    }


def cond(status: str, reason: str, generation: int | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"type": "Paused", "status": status, "reason": reason}
    if generation is not None:
        c["observedGeneration"] = generation
    return c


STATES = {
    "no-mode-is-running": (body(), M.RUNNING, False, False),
    "paused-asked-none-recorded": (body("Paused"), M.PAUSED, False, False),
    "paused-recorded": (body("Paused", [cond("True", "Paused", 3)]), M.PAUSED, True, False),
    "pause-failed-at-this-generation": (
        body("Paused", [cond("False", "PauseFailed", 3)]),
        M.PAUSED,
        False,
        True,
    ),
    "pause-failed-at-an-older-generation-is-tried-again": (
        body("Paused", [cond("False", "PauseFailed", 2)]),
        M.PAUSED,
        False,
        False,
    ),
    "resume-failed-keeps-it-recorded-paused": (
        body("Running", [cond("True", "ResumeFailed", 3)]),
        M.RUNNING,
        True,
        True,
    ),
}


@pytest.mark.parametrize(("obj", "mode", "paused", "failed"), STATES.values(), ids=list(STATES))
def test_sandbox_state_reads_mode_and_paused_condition(
    obj: dict[str, Any], mode: OperatingMode, paused: bool, failed: bool
) -> None:
    state = SandboxState.from_object(obj)
    assert (state.mode, state.paused, state.mode_failed) == (mode, paused, failed)


# ---------------------------------------------------------------- the sync's rows


def container() -> ContainerView:
    return ContainerView(CID, {SANDBOX_LABEL: KEY})


def sandbox(phase: SandboxPhase, mode: OperatingMode, *, paused: bool = False) -> SandboxState:
    return SandboxState(KEY, phase, CID, mode=mode, paused=paused)


ROWS = {
    "running-asked-paused-applies-mode": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED),
        False,
        [Action(ActionKind.APPLY_MODE, KEY, CID)],
    ),
    "paused-and-recorded-does-nothing": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED, paused=True),
        False,
        [],
    ),
    "recorded-paused-asked-running-applies-mode": (
        sandbox(SandboxPhase.RUNNING, M.RUNNING, paused=True),
        False,
        [Action(ActionKind.APPLY_MODE, KEY, CID)],
    ),
    "paused-on-a-drained-node-is-stopped": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED, paused=True),
        True,
        [Action(ActionKind.STOP_DRAINED, KEY, CID)],
    ),
    "scheduled-asked-paused-starts-first": (
        SandboxState(KEY, SandboxPhase.SCHEDULED, mode=M.PAUSED),
        False,
        [Action(ActionKind.START, KEY)],
    ),
    "stopped-asked-paused-is-cleaned-up": (
        sandbox(SandboxPhase.STOPPED, M.PAUSED, paused=True),
        False,
        [Action(ActionKind.CLEANUP, KEY, CID)],
    ),
}


@pytest.mark.parametrize(("sb", "drained", "expected"), ROWS.values(), ids=list(ROWS))
def test_plan_sync_mode_rows(sb: SandboxState, drained: bool, expected: list[Action]) -> None:
    containers = [] if sb.phase is SandboxPhase.SCHEDULED else [container()]
    assert plan_sync([sb], containers, drained=drained, in_flight=()) == expected


# ---------------------------------------------- a mode change between passes

APPLY = Action(ActionKind.APPLY_MODE, KEY, CID)
BETWEEN_PASSES = {
    # (sandbox, its container listed, drained, in flight, in use) -> the action
    "pause-asked-applies-at-once": (sandbox(SandboxPhase.RUNNING, M.PAUSED), True, {}, APPLY),
    "resume-asked-applies-at-once": (
        sandbox(SandboxPhase.RUNNING, M.RUNNING, paused=True),
        True,
        {},
        APPLY,
    ),
    "already-paused-needs-nothing": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED, paused=True),
        True,
        {},
        None,
    ),
    "no-container-listed-waits-for-the-pass": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED),
        False,
        {},
        None,
    ),
    "work-in-flight-waits-for-the-pass": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED),
        True,
        {"in_flight": {KEY}},
        None,
    ),
    "a-drain-stops-it-in-the-pass-not-here": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED),
        True,
        {"drained": True},
        None,
    ),
    "a-stream-open-holds-the-pause": (
        sandbox(SandboxPhase.RUNNING, M.PAUSED),
        True,
        {"in_use": {KEY}},
        None,
    ),
    "a-suspension-is-the-pass-s-to-judge": (
        sandbox(SandboxPhase.RUNNING, M.SUSPENDED),
        True,
        {},
        None,
    ),
    "a-start-is-the-pass-s-to-judge": (
        SandboxState(KEY, SandboxPhase.SCHEDULED, mode=M.PAUSED),
        False,
        {},
        None,
    ),
}


@pytest.mark.parametrize(
    ("sb", "listed", "given", "expected"), BETWEEN_PASSES.values(), ids=list(BETWEEN_PASSES)
)
def test_a_mode_change_between_passes_pauses_or_resumes_and_nothing_else(
    sb: SandboxState, listed: bool, given: dict[str, Any], expected: Action | None
) -> None:
    action = plan_mode_change(
        sb,
        container() if listed else None,
        drained=given.get("drained", False),
        in_flight=given.get("in_flight", ()),
        in_use=given.get("in_use", ()),
    )
    assert action == expected


def test_only_a_change_of_the_asked_mode_is_acted_on_between_passes() -> None:
    assert mode_asked(body("Running"), body("Paused"))
    assert mode_asked(body("Paused"), body(None))  # unset is Running
    assert not mode_asked(body(None), body("Running"))
    assert not mode_asked(body("Paused"), body("Paused", [cond("True", "Paused", 3)]))
    assert not mode_asked(None, body("Paused"))  # added: the pass starts it
    assert not mode_asked(body("Paused"), None)  # deleted


# ---------------------------------------------------------------- condition and streams


def test_paused_condition_keeps_its_transition_time_across_a_reworded_record() -> None:
    first = set_condition((), paused_condition(M.PAUSED, NODE, 3), T0)
    again = set_condition(first, paused_condition(M.PAUSED, "node-b", 4), T0 + timedelta(1))
    assert again[0].last_transition_time == T0 and again[0].observed_generation == 4
    resumed = set_condition(again, paused_condition(M.RUNNING, NODE, 5), T0 + timedelta(2))
    assert (resumed[0].status, resumed[0].reason) == ("False", "Resumed")
    assert resumed[0].last_transition_time == T0 + timedelta(2)


def test_a_refused_pause_records_the_task_still_running() -> None:
    c = paused_condition(M.PAUSED, NODE, 7, "runc: freezer unavailable")
    assert (c.status, c.reason, c.observed_generation) == ("False", "PauseFailed", 7)
    assert "freezer unavailable" in c.message
    c = paused_condition(M.RUNNING, NODE, 8, "boom")
    assert (c.status, c.reason) == ("True", "ResumeFailed")


REFUSALS = {
    "paused-spec-refused-naming-the-mode": (body("Paused"), "spec.operatingMode"),
    "still-frozen-while-resuming-refused": (body("Running", [cond("True", "Paused")]), "frozen"),
    "running-allowed": (body("Running", [cond("False", "Resumed")]), None),
    "never-paused-allowed": (body(), None),
}


@pytest.mark.parametrize(("obj", "says"), REFUSALS.values(), ids=list(REFUSALS))
def test_stream_refusal(obj: dict[str, Any], says: str | None) -> None:
    refusal = stream_refusal(obj, "exec")
    if says is None:
        assert refusal is None
    else:
        assert refusal is not None and says in refusal and "ns/box" in refusal


# ---------------------------------------------------------------- the agent's work


class World:
    def __init__(self, mode: str, task: TaskState = T.RUNNING) -> None:
        self.clock = FakeClock(T0)
        self.objects = FakeObjects(self.clock.now)
        self.rt = FakeRuntime()
        self.info = self.rt.add(CID, {SANDBOX_LABEL: KEY}, state=task)
        self.objects.add_sandbox("ns", "box", T0, node=NODE, phase="Running")
        stored = self.objects.sandboxes[KEY]
        stored["spec"]["operatingMode"] = mode
        stored["metadata"]["generation"] = 2
        status = StatusWriter(self.objects, NODE, self.clock.now)  # type: ignore[arg-type]
        self.modes = ModeChanges(self.rt, status, NODE, call_timeout=0.2)

    def apply(self) -> ModeStep | None:
        return self.modes.apply(self.objects.get_sandbox("ns", "box"), self.info)

    def condition(self) -> Any:
        found = parse_conditions(self.objects.sandboxes[KEY]["status"].get("conditions"))
        return found[0] if found else None


def test_apply_pauses_the_task_and_records_it() -> None:
    world = World("Paused")
    assert world.apply() is ModeStep.PAUSE
    assert world.rt.tasks[CID].state is T.PAUSED
    c = world.condition()
    assert (c.status, c.reason, c.observed_generation) == ("True", "Paused", 2)
    assert world.objects.sandboxes[KEY]["status"]["phase"] == "Running"


def test_apply_resumes_a_paused_task() -> None:
    world = World("Running", task=T.PAUSED)
    assert world.apply() is ModeStep.RESUME
    assert world.rt.tasks[CID].state is T.RUNNING
    assert (world.condition().status, world.condition().reason) == ("False", "Resumed")


@pytest.mark.parametrize(
    ("mode", "task", "call", "after", "said"),
    [
        ("Paused", T.RUNNING, "pause_task", T.PAUSED, ("True", "Paused")),
        ("Running", T.PAUSED, "resume_task", T.RUNNING, ("False", "Resumed")),
    ],
    ids=["pause", "resume"],
)
def test_a_pending_mode_is_one_runtime_call_with_no_task_read_before_it(
    mode: str, task: TaskState, call: str, after: TaskState, said: tuple[str, str]
) -> None:
    world = World(mode, task=task)
    reads: list[str] = []
    read = world.rt.get_task

    def counted(container_id: str, *, timeout: float) -> Any:
        reads.append(container_id)
        return read(container_id, timeout=timeout)

    world.rt.get_task = counted  # type: ignore[method-assign]
    assert world.apply() is ModeStep(call.removesuffix("_task"))
    assert world.rt.calls == [(call, CID)]
    assert reads == [], "the task was read before a call the record already implied"
    assert world.rt.tasks[CID].state is after
    assert (world.condition().status, world.condition().reason) == said


@pytest.mark.parametrize(
    ("mode", "task", "step", "said"),
    [
        ("Paused", T.PAUSED, ModeStep.RECORD, ("True", "Paused")),
        ("Running", T.RUNNING, ModeStep.RECORD, ("False", "Resumed")),
        ("Paused", T.STOPPED, ModeStep.LEAVE, None),
        ("Running", T.STOPPED, ModeStep.LEAVE, None),
    ],
    ids=["paused-already", "running-already", "pause-stopped", "resume-stopped"],
)
def test_a_call_the_task_refuses_reads_it_and_records_what_stands(
    mode: str, task: TaskState, step: ModeStep, said: tuple[str, str] | None
) -> None:
    world = World(mode, task=task)
    assert world.apply() is step
    assert world.rt.tasks[CID].state is task, "a refused call changed the task"
    c = world.condition()
    assert (None if c is None else (c.status, c.reason)) == said


def test_mode_call_is_the_call_the_pending_mode_makes() -> None:
    assert mode_call(M.PAUSED) is ModeStep.PAUSE
    assert mode_call(M.RUNNING) is ModeStep.RESUME


def test_a_silent_shim_writes_nothing_and_is_tried_again() -> None:
    world = World("Paused")
    world.rt.wedged.add(CID)
    assert world.rt.shim_clock.drive(world.apply, busy=lambda finished: 1) is None
    assert world.rt.shim_clock.now > 0, "the pause did not wait out its deadline"
    assert ("pause_task", CID) in world.rt.calls, "the pause under test was never tried"
    assert world.condition() is None


def test_a_task_the_runtime_refuses_to_pause_is_recorded_failed() -> None:
    world = World("Paused", task=T.CREATED)
    assert world.apply() is ModeStep.LEAVE, "a task never started is not paused"
    world = World("Paused")

    def refuse(container_id: str, *, timeout: float) -> None:
        raise RuntimeError_("Tasks.Pause: freezer unavailable", "failed_precondition")

    world.rt.pause_task = refuse  # type: ignore[method-assign]
    assert world.apply() is ModeStep.PAUSE
    c = world.condition()
    assert (c.status, c.reason, c.observed_generation) == ("False", "PauseFailed", 2)
    state = SandboxState.from_object(world.objects.get_sandbox("ns", "box"))
    assert plan_sync([state], [container()], drained=False, in_flight=()) == []


def test_a_paused_sandbox_still_counts_in_the_node_capacity() -> None:
    paused = body("Paused", [cond("True", "Paused")])
    paused["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    waiting = body()
    waiting["metadata"] = {**waiting["metadata"], "name": "next"}
    waiting["status"] = {"phase": "Scheduled"}
    waiting["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    facts = StartFacts(NODE, Capacity(10, 2**30 + 1), {"ns/box": paused, "ns/next": waiting})
    states = [SandboxState.from_object(paused), SandboxState.from_object(waiting)]
    [fail] = plan_sync(states, [container()], drained=False, in_flight=(), facts=facts)
    assert (fail.kind, fail.key, fail.reason) == (ActionKind.FAIL, "ns/next", "OverCapacity")
    assert "does not fit" in fail.message


# ---------------------------------------------------------------- stopping a paused task


def test_stop_resumes_a_paused_task_so_that_it_sees_sigterm() -> None:
    rt = FakeRuntime()
    rt.add("c1", state=T.PAUSED)
    result = stop(rt, "c1", stop_grace=0.5, kill_wait=0.2, call_timeout=0.2)
    assert rt.calls.index(("resume_task", "c1")) < rt.calls.index(("kill_task", "c1"))
    assert result.exit_status is not None
    assert result.exit_status.code == 128 + signal.SIGTERM, "the grace passed unseen: SIGKILLed"
    assert not rt.containers


def test_teardown_kills_a_paused_task_without_resuming_it() -> None:
    rt = FakeRuntime()
    rt.add("c1", state=T.PAUSED)
    result = teardown(rt, "c1", kill_wait=0.2, call_timeout=0.2)
    assert result.exit_status is not None and result.exit_status.code == 128 + signal.SIGKILL
    assert ("resume_task", "c1") not in rt.calls and not rt.containers


def _with_paused(status: str | None, reason: str = "Paused", observed: int = 2) -> dict[str, Any]:
    conditions = (
        []
        if status is None
        else [
            {
                "type": "Paused",
                "status": status,
                "reason": reason,
                "message": "why",
                "observedGeneration": observed,
            }
        ]
    )
    return {"metadata": {"generation": 2}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("body", "mode", "outcome"),
    [
        (_with_paused(None), M.PAUSED, None),
        (_with_paused(None), M.RUNNING, "applied"),
        (_with_paused("True"), M.PAUSED, "applied"),
        (_with_paused("True"), M.RUNNING, None),
        (_with_paused("False", "Resumed"), M.RUNNING, "applied"),
        (_with_paused("False", "PauseFailed"), M.PAUSED, "why"),
        (_with_paused("False", "PauseFailed", observed=1), M.PAUSED, None),
        (_with_paused("True", "Idle"), M.RUNNING, "applied"),
        (_with_paused("True", "Idle"), M.PAUSED, "applied"),
    ],
    ids=[
        "never-paused-pause-waits",
        "never-paused-resume-is-applied",
        "frozen-pause-applied",
        "frozen-resume-waits",
        "resumed-applied",
        "refused-for-this-spec",
        "refused-for-an-older-spec-waits",
        "idle-paused-is-running-as-asked",
        "idle-paused-is-frozen-as-asked",
    ],
)
def test_mode_outcome_tells_a_waiter_applied_refused_or_not_yet(
    body: dict[str, Any], mode: OperatingMode, outcome: str | None
) -> None:
    assert mode_outcome(body, mode) == outcome


def test_apply_holds_a_pause_off_while_a_stream_uses_the_sandbox() -> None:
    world = World("Paused")
    world.modes.in_use = lambda: {KEY}
    assert world.apply() is ModeStep.WAIT
    assert world.rt.tasks[CID].state is T.RUNNING, "frozen under an open stream"
    assert world.condition() is None, "said paused while it runs"
    world.modes.in_use = frozenset
    assert world.apply() is ModeStep.PAUSE
    assert world.rt.tasks[CID].state is T.PAUSED
