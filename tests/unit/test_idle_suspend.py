"""Idle suspension (``spec.idleAction: Suspend``): what the sync does about a sandbox
found idle, held suspended and woken by a use, and how a use and a suspension are
ordered, as plain data."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from sandlot.agent.idlewake import IdleSuspends
from sandlot.api.keys import CLAIM_LABEL, SANDBOX_LABEL
from sandlot.api.sandbox import IdleAction, OperatingMode
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import ActionKind, SandboxState, plan_sync
from sandlot.policy.idle import (
    claim_wakes,
    effective_mode,
    idle_action,
    restores_for_stream,
    woken_outcome,
)
from sandlot.policy.operatingmode import mode_outcome
from sandlot.policy.suspension import idle_suspended

KEY = "ns/sb"
CONTAINER = ContainerView(id="c1", labels={SANDBOX_LABEL: KEY})


def sandbox(
    *,
    suspended: tuple[str, str] | None = None,
    mode: str = "Running",
    phase: str = "Running",
    container: bool = True,
    action: str | None = "Suspend",
) -> dict[str, Any]:
    conditions = []
    if suspended is not None:
        conditions.append(
            {"type": "Suspended", "status": suspended[0], "reason": suspended[1], "message": "m"}
        )
    spec: dict[str, Any] = {"operatingMode": mode, "idleTimeoutSeconds": 60}
    if action is not None:
        spec["idleAction"] = action
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if container:
        status["containerId"] = "c1"
    return {
        "metadata": {"namespace": "ns", "name": "sb", "uid": "u1"},
        "spec": spec,
        "status": status,
    }


IDLE = ("True", "Idle")


def test_idle_action_is_pause_unless_it_says_suspend() -> None:
    assert idle_action(sandbox(action=None)) is IdleAction.PAUSE
    assert idle_action(sandbox(action="Pause")) is IdleAction.PAUSE
    assert idle_action(sandbox()) is IdleAction.SUSPEND


def test_an_idle_suspension_holds_until_a_use_wakes_it() -> None:
    obj = sandbox(suspended=IDLE, container=False)
    assert idle_suspended(obj) and restores_for_stream(obj)
    assert effective_mode(obj) is OperatingMode.SUSPENDED
    assert effective_mode(obj, waking=True) is OperatingMode.RUNNING
    assert not idle_suspended(sandbox(suspended=("True", "Suspended")))
    assert not restores_for_stream(sandbox(suspended=IDLE, mode="Paused"))
    assert mode_outcome(obj, OperatingMode.RUNNING) == "applied"  # resume() returns at once


ROWS = [
    # (name, sandbox, container present, flags, actions)
    ("due-and-running", sandbox(), True, {"idle_suspend_due": True}, [ActionKind.IDLE_SUSPEND]),
    ("not-due", sandbox(), True, {}, []),
    ("due-but-a-use-waits", sandbox(), True, {"idle_suspend_due": True, "waking": True}, []),
    ("due-but-a-stream-is-open", sandbox(), True, {"idle_suspend_due": True, "in_use": True}, []),
    (
        "due-but-the-spec-asks-paused",
        sandbox(mode="Paused"),
        True,
        {"idle_suspend_due": True},
        [ActionKind.APPLY_MODE],
    ),
    ("idle-suspended-stays", sandbox(suspended=IDLE, container=False), False, {}, []),
    (
        "idle-suspended-woken-restores",
        sandbox(suspended=IDLE, container=False),
        False,
        {"waking": True},
        [ActionKind.RESTORE],
    ),
    (
        "idle-suspended-its-container-left-is-removed",
        sandbox(suspended=IDLE),
        True,
        {},
        [ActionKind.SUSPEND],
    ),
    (
        "a-spec-suspension-is-not-idle",
        sandbox(suspended=("True", "Suspended"), container=False),
        False,
        {},
        [ActionKind.RESTORE],
    ),
]


@pytest.mark.parametrize(
    ("obj", "container", "flags", "actions"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_the_sync_plans_idle_suspensions(
    obj: dict[str, Any], container: bool, flags: dict[str, bool], actions: list[ActionKind]
) -> None:
    state = replace(
        SandboxState.from_object(obj),
        idle_suspend_due=flags.get("idle_suspend_due", False),
        waking=flags.get("waking", False),
    )
    in_use = flags.get("in_use", False)
    views = [CONTAINER] if container else []
    planned = plan_sync([state], views, drained=False, in_flight=(), in_use={KEY} if in_use else ())
    assert [a.kind for a in planned] == actions


OUTCOMES = [
    ("still-idle-suspended", sandbox(suspended=IDLE, container=False), None),
    ("restored", sandbox(suspended=("False", "Restored")), "running"),
    ("restored-not-yet-recorded", sandbox(suspended=("False", "Restored"), container=False), None),
    ("no-room", sandbox(suspended=("True", "Suspended"), container=False), "m"),
    ("restore-refused", sandbox(suspended=("True", "RestoreFailed"), container=False), "m"),
    ("ended", sandbox(phase="Stopped"), "it is Stopped (None)"),
    ("deleted", None, "it was deleted"),
]


@pytest.mark.parametrize(
    ("obj", "outcome"), [r[1:] for r in OUTCOMES], ids=[r[0] for r in OUTCOMES]
)
def test_a_use_waits_until_its_sandbox_runs_or_cannot(
    obj: dict[str, Any] | None, outcome: str | None
) -> None:
    assert woken_outcome(obj, "u1") == outcome


def test_a_use_of_another_sandbox_of_that_name_is_not_served() -> None:
    assert woken_outcome(sandbox(suspended=("False", "Restored")), "other-uid") == "it was deleted"


def test_a_claim_wakes_a_member_idle_suspended_before_its_claim() -> None:
    obj = sandbox(suspended=IDLE, container=False)
    obj["metadata"]["labels"] = {CLAIM_LABEL: "c"}
    assert claim_wakes(obj, paused_unclaimed=True)
    assert not claim_wakes(obj, paused_unclaimed=False)


# ---------------------------------------------------------------- the agent's ordering


class View:
    """The agent's watch, as ``IdleSuspends`` reads it."""

    def __init__(self, obj: dict[str, Any] | None) -> None:
        self.obj = obj

    def get(self, _key: str) -> dict[str, Any] | None:
        return self.obj


def test_a_use_cancels_a_due_suspension_and_a_refused_commit_pauses_from_then_on() -> None:
    """Whether a stream is open is the stream server's (``test_stream_slots``)."""
    wakes: list[str] = []
    view = View(sandbox())
    coordinator = IdleSuspends(view.get, lambda: wakes.append("sync"))
    assert coordinator.request(KEY) and coordinator.flags() == (frozenset({KEY}), frozenset())
    coordinator.wake_for_claim(sandbox())
    assert not coordinator.begin(KEY), "began with a use waiting"
    assert coordinator.flags()[0] == frozenset()  # not due any more: the idle loop asks again
    coordinator.forget({KEY}, set())  # the claim's wake is over: it runs

    assert coordinator.request(KEY) and coordinator.begin(KEY)
    coordinator.refused(KEY)  # a commit the runtime refused: paused from now on
    assert not coordinator.request(KEY) and coordinator.is_refused(KEY)
    assert wakes == ["sync", "sync", "sync"]


def test_a_use_waits_for_the_restore_its_wake_asks_for() -> None:
    view = View(sandbox(suspended=IDLE, container=False))
    coordinator = IdleSuspends(view.get)
    seen: list[tuple[frozenset[str], frozenset[str]]] = []

    def restore() -> None:  # what the sync does once it sees the wake
        seen.append(coordinator.flags())
        view.obj = sandbox(suspended=("False", "Restored"))
        coordinator.changed()

    coordinator.wake_sync = lambda: threading.Thread(target=restore).start()
    assert coordinator.wake_for_use(view.obj or {}, "exec", timeout=10) is None
    assert seen == [(frozenset(), frozenset({KEY}))]
    assert coordinator.flags() == (frozenset(), frozenset()), "the wake outlived its use"


def test_a_use_whose_connection_ends_stops_waiting_and_waits_no_more() -> None:
    """A peer gone while its admission waits for a restore that cannot proceed: the
    wait ends at once, not at its bound, and the sandbox is waited for no more."""
    view = View(sandbox(suspended=IDLE, container=False))
    coordinator = IdleSuspends(view.get)
    gone = threading.Event()
    waiting: list[frozenset[str]] = []

    def wake_sync() -> None:  # the sync would plan the restore; the peer leaves meanwhile
        waiting.append(coordinator.flags()[1])
        gone.set()

    coordinator.wake_sync = wake_sync
    said = coordinator.wake_for_use(view.obj or {}, "files", timeout=60, gone=gone.is_set)
    assert said is not None and "the files went away" in said
    assert waiting == [frozenset({KEY})], "the use was not waiting while it waited"
    assert not coordinator.waking(KEY) and coordinator.flags() == (frozenset(), frozenset())


def test_a_use_whose_restore_is_refused_or_late_says_why() -> None:
    view = View(sandbox(suspended=IDLE, container=False))
    coordinator = IdleSuspends(view.get)
    said = coordinator.wake_for_use(view.obj or {}, "files", timeout=0.05)
    assert said is not None and "did not start again within 0.05s for files" in said
    view.obj = sandbox(suspended=("True", "RestoreFailed"), container=False)
    said = coordinator.wake_for_use(view.obj, "exec", timeout=5)
    assert said is not None and "cannot start again for exec: m" in said


def claimed(mark: str | None, idle_since: str, kind: str = "Paused") -> dict[str, Any]:
    """An idle member a claim took; ``mark``: the idle episode the bind recorded."""
    obj = sandbox(suspended=IDLE, container=False) if kind == "Suspended" else sandbox()
    if kind == "Paused":
        obj["status"]["conditions"] = [{"type": "Paused", "status": "True", "reason": "Idle"}]
    obj["status"]["conditions"][0]["lastTransitionTime"] = idle_since
    obj["metadata"]["labels"] = {CLAIM_LABEL: "c"}
    obj["metadata"]["annotations"] = {"sandlot.dev/claimed-at": "2030-01-01T00:00:30Z"}
    if mark is not None:
        obj["metadata"]["annotations"]["sandlot.dev/claimed-idle"] = mark
    return obj


AT = "2030-01-01T00:00:00Z"
AFTER_RESTART = [
    ("paused-then-claimed", claimed(f"Paused {AT}", AT), True),
    ("suspended-then-claimed", claimed(f"Suspended {AT}", AT, "Suspended"), True),
    # The claim's own time says nothing: only the recorded episode does.
    ("idle-again-after-its-claim", claimed(f"Paused {AT}", "2030-01-01T00:01:00Z"), False),
    ("claimed-while-not-idle", claimed(None, AT), False),
    ("an-empty-mark", claimed("", AT), False),
    ("another-kinds-mark", claimed(f"Suspended {AT}", AT), False),
]


@pytest.mark.parametrize(
    ("obj", "wakes"), [r[1:] for r in AFTER_RESTART], ids=[r[0] for r in AFTER_RESTART]
)
def test_a_restarted_agent_tells_an_idle_member_claimed_since_from_the_binds_mark(
    obj: dict[str, Any], wakes: bool
) -> None:
    """Nothing remembered (``paused_unclaimed`` False): the bind's mark decides."""
    assert claim_wakes(obj, paused_unclaimed=False) is wakes
