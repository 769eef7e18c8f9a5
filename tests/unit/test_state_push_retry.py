"""A push of suspended state that failed for a reason that may pass is owed, written
down and tried again: ``policy.statepush`` with plain data, the sync's rows (a drain
does not end a sandbox whose push is owed), and ``agent.suspend.Suspensions`` over a
store that refuses, then answers, at the agent's boundary (a fake clock, no sleeps)."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.api.common import Condition
from sandlot.api.reasons import SuspendedReason
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.agentsync import Action, ActionKind, SandboxState, plan_sync
from sandlot.policy.pulling import FailureKind
from sandlot.policy.statepush import owing, push_may_pass, push_pending, settled
from sandlot.policy.suspension import SuspendStep, suspended_image_name
from tests.unit.test_suspension import CID, KEY, FakeStore, World, cond

M = OperatingMode

# ---------------------------------------------------------------- policy


@pytest.mark.parametrize(
    ("kind", "again"),
    [
        (FailureKind.TRANSIENT, True),
        (None, True),
        (FailureKind.UNAUTHORIZED, False),
        (FailureKind.NOT_FOUND, False),
        (FailureKind.TOO_LARGE, False),
    ],
    ids=["registry-down-or-5xx", "no-answer-in-time", "denied", "not-found", "too-large"],
)
def test_a_push_is_tried_again_only_when_its_failure_may_pass(
    kind: FailureKind | None, again: bool
) -> None:
    assert push_may_pass(kind) is again


def obj(conditions: list[dict[str, Any]], state: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "conditions": conditions}
    if state is not None:
        status["suspendedState"] = state
    return {"metadata": {"namespace": "ns", "name": "box", "uid": "u"}, "status": status}


@pytest.mark.parametrize(
    ("body", "owed"),
    [
        (obj([cond("True", "PushPending")]), True),
        (obj([cond("True", "IdlePushPending")]), True),
        (obj([cond("True", "Suspended")]), False),
        (obj([cond("True", "Idle")]), False),
        (obj([cond("False", "Restored")]), False),
        (obj([cond("True", "PushPending")], {"image": "r/s:u@sha256:1"}), False),
        (obj([]), False),
    ],
    ids=[
        "owed",
        "owed-by-an-idle-suspend",
        "pushed-or-never-tried",
        "idle-suspended-not-owed",
        "restored",
        "pushed-since",
        "no-condition",
    ],
)
def test_a_push_is_owed_when_the_condition_says_so(body: dict[str, Any], owed: bool) -> None:
    assert push_pending(body) is owed


@pytest.mark.parametrize(
    ("reason", "owed", "paid"),
    [
        (SuspendedReason.SUSPENDED, "PushPending", "Suspended"),
        (SuspendedReason.IDLE, "IdlePushPending", "Idle"),
        (SuspendedReason.IDLE_PUSH_PENDING, "IdlePushPending", "Idle"),
    ],
    ids=["asked", "idle", "idle-owed-already"],
)
def test_owing_and_settled_keep_whether_it_was_idle(
    reason: SuspendedReason, owed: str, paid: str
) -> None:
    c = Condition(type="Suspended", status="True", reason=reason, message="m")
    assert (owing(c).reason, settled(owing(c)).reason) == (owed, paid)


# ---------------------------------------------------------------- the sync's rows


def state(mode: OperatingMode, *, pushed: bool = False, owed: bool = False) -> SandboxState:
    return SandboxState(
        KEY,
        SandboxPhase.RUNNING,
        CID,
        mode=mode,
        suspended=True,
        pushed=pushed,
        push_pending=owed,
    )


PUSH = [Action(ActionKind.PUSH, KEY)]
ROWS = {
    "owed-on-a-drained-node-is-pushed-not-ended": (state(M.SUSPENDED, owed=True), True, PUSH),
    "owed-asked-to-run-on-a-drained-node-is-pushed": (state(M.RUNNING, owed=True), True, PUSH),
    "owed-and-suspended-is-pushed": (state(M.SUSPENDED, owed=True), False, PUSH),
    "owed-but-asked-to-run-restores-here": (
        state(M.RUNNING, owed=True),
        False,
        [Action(ActionKind.RESTORE, KEY)],
    ),
    "not-owed-on-a-drained-node-is-ended": (
        state(M.SUSPENDED),
        True,
        [Action(ActionKind.END_DRAINED, KEY)],
    ),
    "pushed-on-a-drained-node-waits-to-move": (state(M.SUSPENDED, pushed=True), True, []),
}


@pytest.mark.parametrize(("sb", "drained", "expected"), ROWS.values(), ids=list(ROWS))
def test_plan_sync_push_rows(sb: SandboxState, drained: bool, expected: list[Action]) -> None:
    assert plan_sync([sb], [], drained=drained, in_flight=()) == expected


def test_the_sync_reads_an_owed_push_from_the_condition() -> None:
    assert SandboxState.from_object(obj([cond("True", "PushPending")])).push_pending
    assert not SandboxState.from_object(obj([cond("True", "Suspended")])).push_pending


# ---------------------------------------------------------------- the agent


def suspended_with_a_failing_push(store: FakeStore) -> World:
    world = World("Suspended")
    assert world.info is not None
    world.use_store(store)
    wakes: list[float] = []
    world.suspensions.wake_in = wakes.append
    world.wakes = wakes  # type: ignore[attr-defined]
    assert world.suspensions.suspend(world.body(), world.info) is SuspendStep.COMMIT
    return world


def test_a_push_that_failed_once_is_owed_and_tried_again_after_its_back_off() -> None:
    store = FakeStore("HTTP 503 Service Unavailable")
    world = suspended_with_a_failing_push(store)
    c = world.condition()
    assert (c.status, c.reason) == ("True", "PushPending")
    assert "not pushed yet (HTTP 503 Service Unavailable): tried again in 5s (failure 1)" in (
        c.message
    )
    assert world.work.torn_down == [CID]  # suspended all the same, on this node
    assert world.wakes == [5.0]  # type: ignore[attr-defined]
    assert SandboxState.from_object(world.body()).push_pending

    world.clock.advance(4)  # not due: nothing tried, nothing written
    version = world.body()["metadata"]["resourceVersion"]
    world.suspensions.push_owed(world.body())
    assert world.body()["metadata"]["resourceVersion"] == version

    world.clock.advance(1)  # due, still refused: twice as long
    world.suspensions.push_owed(world.body())
    assert "tried again in 10s (failure 2)" in world.condition().message
    assert world.wakes[-1] == 10.0  # type: ignore[attr-defined]

    store.refuse = None  # the registry answers again
    world.clock.advance(10)
    world.suspensions.push_owed(world.body())
    status = world.objects.sandboxes[KEY]["status"]
    assert status["suspendedState"]["image"].startswith(f"reg.example/state:{world.uid}@")
    c = world.condition()
    assert (c.status, c.reason) == ("True", "Suspended") and "pushed to reg.example" in c.message
    assert store.pushed == [(world.uid, suspended_image_name(world.uid))]
    assert not SandboxState.from_object(world.body()).push_pending


def test_a_restarted_agent_pushes_an_owed_state_at_once() -> None:
    store = FakeStore("connection refused")
    world = suspended_with_a_failing_push(store)
    store.refuse = None
    world.suspensions = type(world.suspensions)(world.work)  # type: ignore[arg-type]
    world.use_store(store)  # a new agent: no back-off in memory, the condition says it is owed
    world.suspensions.push_owed(world.body())
    assert "suspendedState" in world.objects.sandboxes[KEY]["status"]
    assert world.condition().reason == "Suspended"


def test_a_push_refused_for_good_is_not_owed_and_the_drain_may_end_it() -> None:
    world = suspended_with_a_failing_push(FakeStore("denied", FailureKind.UNAUTHORIZED))
    c = world.condition()
    assert c.reason == "Suspended" and "not pushed (denied): it stays on this node" in c.message
    assert world.wakes == []  # type: ignore[attr-defined]
    sb = SandboxState.from_object(world.body())
    assert plan_sync([sb], [], drained=True, in_flight=()) == [Action(ActionKind.END_DRAINED, KEY)]


def test_an_idle_suspend_owing_its_push_stays_idle_suspended() -> None:
    store = FakeStore("HTTP 502 Bad Gateway")
    world = suspended_with_a_failing_push(store)
    stored = world.objects.sandboxes[KEY]
    stored["spec"]["operatingMode"] = "Running"
    stored["spec"]["idleTimeoutSeconds"] = 60
    stored["status"]["conditions"][0]["reason"] = "IdlePushPending"
    sb = SandboxState.from_object(world.body())
    assert sb.idle_suspended and sb.push_pending
    assert plan_sync([sb], [], drained=False, in_flight=()) == PUSH  # held, not restored
    store.refuse = None
    world.clock.advance(5)
    world.suspensions.push_owed(world.body())
    c = world.condition()
    assert (c.status, c.reason) == ("True", "Idle") and "pushed to reg.example" in c.message
