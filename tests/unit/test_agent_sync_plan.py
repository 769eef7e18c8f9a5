"""The agent's sync table: every row of ``policy.agentsync.plan_sync``, as data."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import (
    Action,
    ActionKind,
    SandboxState,
    containers_by_key,
    drain_stop_stands,
    live_count,
    phase_counts,
    plan_sync,
    plan_thaws,
)
from sandlot.policy.operatingmode import TaskState

KEY = "ns/box"
CID = "sb-uid-1"

P = SandboxPhase


def container(key: str = KEY, cid: str = CID) -> ContainerView:
    return ContainerView(cid, {SANDBOX_LABEL: key})


def sandbox(phase: SandboxPhase, key: str = KEY, container_id: str | None = None) -> SandboxState:
    return SandboxState(key, phase, container_id)


@dataclass(frozen=True)
class Row:
    sandboxes: list[SandboxState]
    containers: list[ContainerView]
    expected: list[Action]
    drained: bool = False
    in_flight: frozenset[str] = field(default_factory=frozenset)


ROWS: dict[str, Row] = {
    "adopt-running-with-its-container-does-nothing": Row(
        [sandbox(P.RUNNING, container_id=CID)], [container()], []
    ),
    "fence-dead-with-container": Row(
        [sandbox(P.DEAD, container_id=CID)],
        [container()],
        [Action(ActionKind.FENCE, KEY, CID)],
    ),
    "dead-without-container-does-nothing": Row([sandbox(P.DEAD)], [], []),
    "start-scheduled": Row([sandbox(P.SCHEDULED)], [], [Action(ActionKind.START, KEY)]),
    "start-pending-bound-to-this-node": Row(
        [sandbox(P.PENDING)], [], [Action(ActionKind.START, KEY)]
    ),
    "scheduled-with-leftover-container-tears-it-down": Row(
        [sandbox(P.SCHEDULED)],
        [container()],
        [Action(ActionKind.TEARDOWN_UNSTARTED, KEY, CID)],
    ),
    "stop-deleted-container-without-sandbox": Row(
        [], [container()], [Action(ActionKind.STOP_DELETED, KEY, CID)]
    ),
    "drain-stops-running": Row(
        [sandbox(P.RUNNING, container_id=CID)],
        [container()],
        [Action(ActionKind.STOP_DRAINED, KEY, CID)],
        drained=True,
    ),
    "drain-refuses-scheduled": Row(
        [sandbox(P.SCHEDULED)], [], [Action(ActionKind.REFUSE_DRAINED, KEY)], drained=True
    ),
    "drain-still-tears-down-leftover-of-scheduled": Row(
        [sandbox(P.SCHEDULED)],
        [container()],
        [Action(ActionKind.TEARDOWN_UNSTARTED, KEY, CID)],
        drained=True,
    ),
    "running-whose-container-is-gone-ends-lost": Row(
        [sandbox(P.RUNNING, container_id=CID)], [], [Action(ActionKind.END_LOST, KEY)]
    ),
    "running-that-never-recorded-a-container-is-left": Row([sandbox(P.RUNNING)], [], []),
    "orphan-without-sandbox-label-is-not-the-syncs": Row(
        [], [ContainerView("stray", {"other": "label"})], []
    ),
    "key-in-flight-is-skipped": Row([sandbox(P.SCHEDULED)], [], [], in_flight=frozenset({KEY})),
    "start-finishing-during-pass-is-never-torn-down": Row(
        [sandbox(P.SCHEDULED)], [container()], [], in_flight=frozenset({KEY})
    ),
    "deleted-while-in-flight-is-not-stopped-twice": Row(
        [], [container()], [], in_flight=frozenset({KEY})
    ),
    "stopped-with-container-is-cleaned-up": Row(
        [sandbox(P.STOPPED, container_id=CID)],
        [container()],
        [Action(ActionKind.CLEANUP, KEY, CID)],
    ),
    "failed-with-container-is-cleaned-up": Row(
        [sandbox(P.FAILED)], [container()], [Action(ActionKind.CLEANUP, KEY, CID)]
    ),
    "terminal-without-container-does-nothing": Row(
        [sandbox(P.STOPPED), sandbox(P.FAILED, key="ns/other")], [], []
    ),
}


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_plan_sync_row(row: Row) -> None:
    got = plan_sync(row.sandboxes, row.containers, drained=row.drained, in_flight=row.in_flight)
    assert got == row.expected


def test_sandboxes_come_first_in_their_order_then_deleted_containers() -> None:
    sandboxes = [sandbox(P.SCHEDULED, key="ns/b"), sandbox(P.DEAD, key="ns/a")]
    containers = [container("ns/gone", "c-gone"), container("ns/a", "c-a")]
    got = plan_sync(sandboxes, containers, drained=False, in_flight=())
    assert [(a.kind, a.key) for a in got] == [
        (ActionKind.START, "ns/b"),
        (ActionKind.FENCE, "ns/a"),
        (ActionKind.STOP_DELETED, "ns/gone"),
    ]


def test_in_flight_key_is_skipped_while_others_proceed() -> None:
    got = plan_sync(
        [sandbox(P.SCHEDULED, key="ns/busy"), sandbox(P.SCHEDULED, key="ns/free")],
        [],
        drained=False,
        in_flight={"ns/busy"},
    )
    assert got == [Action(ActionKind.START, "ns/free")]


def test_unlabelled_containers_are_not_keyed() -> None:
    by_key = containers_by_key([container(), ContainerView("stray", {})])
    assert list(by_key) == [KEY]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"metadata": {"namespace": "ns", "name": "box"}},
            SandboxState(KEY, P.PENDING, None),
        ),
        (
            {
                "metadata": {"namespace": "ns", "name": "box"},
                "status": {"phase": "Running", "containerId": CID},
            },
            SandboxState(KEY, P.RUNNING, CID),
        ),
        (
            {"metadata": {"namespace": "ns", "name": "box"}, "status": {"phase": "Dead"}},
            SandboxState(KEY, P.DEAD, None),
        ),
    ],
    ids=["no-status-is-pending", "running-with-container", "dead"],
)
def test_sandbox_state_reads_the_object(body: dict[str, object], expected: SandboxState) -> None:
    assert SandboxState.from_object(body) == expected


def test_phase_counts_name_every_phase_so_gauges_fall_to_zero() -> None:
    counts = phase_counts([sandbox(P.RUNNING), sandbox(P.RUNNING, key="ns/2"), sandbox(P.DEAD)])
    assert counts == {
        P.PENDING: 0,
        P.SCHEDULED: 0,
        P.RUNNING: 2,
        P.STOPPED: 0,
        P.FAILED: 0,
        P.DEAD: 1,
    }


@pytest.mark.parametrize(
    ("phases", "expected"),
    [
        ((), 0),
        (("Pending", "Scheduled", "Running"), 3),
        (("Running", "Stopped", "Failed", "Dead"), 1),
        (("Stopped", "Dead"), 0),
    ],
    ids=["none", "every_live_phase_counts", "terminal_ones_do_not", "only_terminal"],
)
def test_live_count_is_the_non_terminal_sandboxes(phases: tuple[str, ...], expected: int) -> None:
    states = [SandboxState(f"ns/s{i}", SandboxPhase(p)) for i, p in enumerate(phases)]
    assert live_count(states) == expected


@pytest.mark.parametrize(
    ("fresh", "stands"),
    [
        (SandboxState(KEY, P.RUNNING, CID), True),
        (SandboxState(KEY, P.RUNNING, CID, mode=OperatingMode.PAUSED, paused=True), True),
        (SandboxState(KEY, P.RUNNING, CID, mode=OperatingMode.SUSPENDED), False),
        (SandboxState(KEY, P.STOPPED, CID), False),
        (SandboxState(KEY, P.DEAD, CID), False),
    ],
    ids=[
        "still_running_is_stopped",
        "paused_is_stopped",
        "asked_to_suspend_meanwhile_is_kept_for_the_move",
        "ended_meanwhile_is_not_the_drain_s",
        "marked_dead_meanwhile_is_fenced_instead",
    ],
)
def test_a_drain_stop_stands_only_while_a_fresh_read_still_plans_it(
    fresh: SandboxState, stands: bool
) -> None:
    # The watched view planned the stop: a Running sandbox on the drained node.
    planned = plan_sync(
        [sandbox(P.RUNNING, container_id=CID)], [container()], drained=True, in_flight=()
    )
    assert planned == [Action(ActionKind.STOP_DRAINED, KEY, CID)]
    assert drain_stop_stands(fresh, container()) is stands


def test_the_plan_without_tasks_has_everything_but_the_thaws_which_need_them() -> None:
    """A pass plans on the containers alone (a task not read is never frozen), hands
    that over, then lists the tasks for the thaws: together the same plan."""
    frozen = SandboxState("ns/frozen", P.RUNNING, "c-frozen")
    new = sandbox(P.SCHEDULED, "ns/new")
    gone = ContainerView("c-gone", {SANDBOX_LABEL: "ns/gone"})
    with_tasks = [ContainerView("c-frozen", {SANDBOX_LABEL: "ns/frozen"}, TaskState.PAUSED), gone]
    without = [ContainerView(c.id, c.labels) for c in with_tasks]
    first = plan_sync([frozen, new], without, drained=False, in_flight=())
    assert [(a.kind, a.key) for a in first] == [
        (ActionKind.START, "ns/new"),
        (ActionKind.STOP_DELETED, "ns/gone"),
    ]
    planned = {a.key for a in first}
    thaws = plan_thaws([frozen, new], with_tasks, drained=False, in_flight=planned)
    assert thaws == [Action(ActionKind.THAW, "ns/frozen", "c-frozen")]
    whole = plan_sync([frozen, new], with_tasks, drained=False, in_flight=())
    assert sorted(first + thaws, key=str) == sorted(whole, key=str)
    # a key already planned this pass, or with work running, gets no thaw beside it
    assert plan_thaws([frozen], with_tasks, drained=False, in_flight={"ns/frozen"}) == []


def test_the_thaws_are_planned_with_the_streams_in_use_as_the_whole_plan_is() -> None:
    """A sandbox due an idle suspension but in use by a stream gets no suspension;
    its frozen, unrecorded task is thawed, by the thaws' plan as by the whole one."""
    due = SandboxState("ns/due", P.RUNNING, "c-due", idle_suspend_due=True)
    views = [ContainerView("c-due", {SANDBOX_LABEL: "ns/due"}, TaskState.PAUSED)]
    whole = plan_sync([due], views, drained=False, in_flight=(), in_use={"ns/due"})
    assert whole == [Action(ActionKind.THAW, "ns/due", "c-due")]
    thaws = plan_thaws([due], views, drained=False, in_flight=(), in_use={"ns/due"})
    assert thaws == whole
