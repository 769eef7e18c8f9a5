"""A pause or resume runs without a sync pass beside it or after it: the change of
mode handed to the sandbox's work from its watch event wakes none, nor does the
status write of that work, and the work's end wakes none once it settled what it
was handed (``policy.agentsync.pass_wanted``, ``policy.syncpacing.wake_after``).
Every other change still wakes one."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from sandlot.adapters.runtime import TaskState
from sandlot.agent.loops import SETTLED, WorkPool
from sandlot.agent.modes import ModeChanges
from sandlot.agent.status import StatusWriter
from sandlot.agent.sync import sandbox_listener
from sandlot.policy.agentsync import WRITTEN, pass_wanted
from sandlot.policy.operatingmode import ModeStep, mode_settled
from sandlot.policy.syncpacing import wake_after
from tests.support.agent import FakeRuntime
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def body(mode: str = "Running", version: str = "10", generation: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "sandlot.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "namespace": "ns",
            "name": "box",
            "uid": "uid-1",
            "resourceVersion": version,
            "generation": generation,
            "labels": {"app": "x"},
        },
        "spec": {"image": "busybox", "nodeName": "node-a", "operatingMode": mode},
        "status": {"phase": "Running", "containerId": "c1", "conditions": []},
    }


def paused_spec_write(old: dict[str, Any]) -> dict[str, Any]:
    """``old`` after a spec write that asks for Paused and changes nothing else."""
    new = copy.deepcopy(old)
    new["spec"]["operatingMode"] = "Paused"
    new["metadata"]["resourceVersion"] = "11"
    new["metadata"]["generation"] = 4
    new["metadata"]["managedFields"] = [{"manager": "sdk", "operation": "Update"}]
    return new


def changed(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """The Paused spec write, with one more field set."""
    new = paused_spec_write(body())
    target = new
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value
    return new


WAKES = {
    "mode-alone-handed-over": (paused_spec_write(body()), True, False),
    "mode-alone-not-handed-over": (paused_spec_write(body()), False, True),
    "mode-and-deletion": (
        changed(("metadata", "deletionTimestamp"), "2026-01-01T12:00:00Z"),
        True,
        True,
    ),
    "mode-and-a-label": (changed(("metadata", "labels"), {"app": "y"}), True, True),
    "mode-and-another-spec-field": (changed(("spec", "nodeName"), "node-b"), True, True),
    "mode-and-status": (changed(("status", "phase"), "Stopped"), True, True),
}


@pytest.mark.parametrize(("new", "handed", "wakes"), WAKES.values(), ids=list(WAKES))
def test_only_a_change_of_mode_handed_over_whole_wakes_no_pass(
    new: dict[str, Any], handed: bool, wakes: bool
) -> None:
    assert pass_wanted("MODIFIED", body(), new, handed=handed) is wakes


def test_an_added_deleted_or_listed_sandbox_wakes_a_pass_whatever_was_handed() -> None:
    assert pass_wanted("ADDED", None, body(), handed=True)
    assert pass_wanted("DELETED", body(), None, handed=True)
    assert pass_wanted("LISTED", None, None, handed=True)


def test_only_the_running_work_s_own_write_wakes_no_pass() -> None:
    written = changed(("status", "conditions"), [{"type": "Paused", "status": "True"}])
    assert not pass_wanted(WRITTEN, body(), written, own_work=True)
    assert pass_wanted(WRITTEN, body(), written, own_work=False), "a prober's or idle write"
    assert pass_wanted("MODIFIED", body(), written, own_work=True), "the watch: anyone's"


class Listened:
    """``sandbox_listener`` over a sync whose hand-over answers ``takes``, the calling
    thread running the work of the keys in ``running``, work running for the keys in
    ``busy``."""

    def __init__(
        self, takes: bool, running: frozenset[str] = frozenset(), busy: frozenset[str] = frozenset()
    ) -> None:
        self.handed: list[dict[str, Any]] = []
        self.held: list[tuple[str, str]] = []
        self.own: list[tuple[str, str]] = []
        self.wake = threading.Event()
        self.looked_again = 0

        def mode_changed(obj: dict[str, Any]) -> bool:
            self.handed.append(obj)
            return takes

        def own_write(key: str, version: str) -> bool:
            if key in running:
                self.own.append((key, version))
            return key in running

        def hold(key: str, version: str) -> bool:
            if key in busy:
                self.held.append((key, version))
            return key in busy

        def suspends_changed() -> None:
            self.looked_again += 1

        sync = SimpleNamespace(mode_changed=mode_changed, own_write=own_write, hold=hold)
        uses = SimpleNamespace(suspends=SimpleNamespace(changed=suspends_changed))
        self.listener = sandbox_listener(sync, self.wake, uses)  # type: ignore[arg-type]


def test_a_pause_handed_over_at_once_runs_without_a_pass_beside_it() -> None:
    seen = Listened(takes=True)
    new = paused_spec_write(body())
    seen.listener("MODIFIED", body(), new)
    assert seen.handed == [new], "the pause was not handed to the sandbox's work"
    assert not seen.wake.is_set(), "a sync pass woken beside a pause it can only skip"
    assert seen.looked_again == 1, "a use waiting on the sandbox was not told"


@pytest.mark.parametrize(
    ("takes", "event", "old", "new"),
    [
        (False, "MODIFIED", body(), paused_spec_write(body())),
        (True, "MODIFIED", body(), changed(("status", "phase"), "Stopped")),
        (True, "MODIFIED", body(), body(version="11")),
        (True, "ADDED", None, body()),
        (True, "DELETED", body(), None),
        (True, "LISTED", None, None),
    ],
    ids=["not-handed-over", "mode-and-status", "no-mode-change", "added", "deleted", "listed"],
)
def test_every_other_change_wakes_a_pass(
    takes: bool, event: str, old: dict[str, Any] | None, new: dict[str, Any] | None
) -> None:
    seen = Listened(takes=takes)
    seen.listener(event, old, new)
    assert seen.wake.is_set()


def test_the_status_write_of_a_sandbox_s_own_work_wakes_no_pass_anyone_else_s_does() -> None:
    written = changed(("status", "conditions"), [{"type": "Paused", "status": "True"}])
    seen = Listened(takes=True, running=frozenset({"ns/box"}), busy=frozenset({"ns/box"}))
    seen.listener(WRITTEN, body(), written)
    assert not seen.wake.is_set(), "a pass woken by the pause's own record, beside its end"
    assert seen.own == [("ns/box", "11")], "the work's own version not noted as its own"
    assert seen.looked_again == 1
    other = Listened(takes=True)  # a write from outside the sandbox's work (the prober)
    other.listener(WRITTEN, body(), written)
    assert other.wake.is_set()


def test_a_write_the_watch_brought_first_wakes_no_second_pass() -> None:
    written = changed(("status", "conditions"), [{"type": "Paused", "status": "True"}])
    seen = Listened(takes=True)
    seen.listener(WRITTEN, written, written)  # the watch's event held this version already
    assert not seen.wake.is_set()


def test_a_change_while_the_sandbox_s_work_runs_is_held_for_its_end() -> None:
    written = changed(("status", "conditions"), [{"type": "Paused", "status": "True"}])
    seen = Listened(takes=True, busy=frozenset({"ns/box"}))
    seen.listener("MODIFIED", body(), written)  # the watch, before the write returned
    assert seen.held == [("ns/box", "11")]
    assert not seen.wake.is_set(), "a pass woken that can only skip the busy key"
    idle = Listened(takes=True)
    idle.listener("MODIFIED", body(), written)
    assert idle.wake.is_set() and idle.held == []


# ---------------------------------------------------------------- the end of the work


@pytest.mark.parametrize(
    ("settled", "looked", "asked", "wakes"),
    [
        (True, False, False, False),
        (True, True, False, True),
        (True, False, True, True),
        (False, False, False, True),
    ],
    ids=["settled", "settled-but-a-pass-skipped-it", "settled-but-asked", "not-settled"],
)
def test_wake_after(settled: bool, looked: bool, asked: bool, wakes: bool) -> None:
    assert wake_after(settled=settled, looked=looked, asked=asked) is wakes


@pytest.mark.parametrize(
    ("step", "recorded", "settled"),
    [
        (ModeStep.PAUSE, True, True),
        (ModeStep.RESUME, True, True),
        (ModeStep.RECORD, True, True),
        (ModeStep.PAUSE, False, False),
        (ModeStep.WAIT, False, False),
        (ModeStep.LEAVE, False, False),
        (None, False, False),
    ],
    ids=["paused", "resumed", "recorded", "unwritten", "waits", "left", "no-answer"],
)
def test_mode_settled(step: ModeStep | None, recorded: bool, settled: bool) -> None:
    assert mode_settled(step, recorded) is settled


@pytest.fixture
def pool() -> Any:
    done = threading.Event()
    made = WorkPool(1, threading.Event(), done)
    yield made, done
    made.shutdown()


def test_the_end_of_settled_work_wakes_no_pass_unless_a_pass_skipped_its_key(pool: Any) -> None:
    work, done = pool
    assert work.take("ns/box")
    work.let_go("ns/box", settled=True)
    assert not done.is_set(), "a pass woken after a pause that left it nothing"
    assert work.take("ns/box")
    assert work.in_flight() == frozenset({"ns/box"})  # a pass planned around it
    work.let_go("ns/box", settled=True)
    assert done.is_set(), "a pass skipped the key meanwhile and never looks again"
    done.clear()
    assert work.take("ns/box")
    work.let_go("ns/box")
    assert done.is_set(), "work that did not settle left no follow-up pass"


def test_submitted_work_answering_settled_ends_without_a_pass(pool: Any) -> None:
    work, done = pool
    ended = threading.Event()
    work.ended = lambda _key: ended.set()
    assert work.submit("ns/box", lambda: SETTLED)
    assert ended.wait(5), "the work never ended"
    work.shutdown()  # waits for the end to finish
    assert not done.is_set()
    assert work.running_here("ns/box") is False


def test_a_change_held_for_the_end_wakes_a_pass_unless_the_work_wrote_it(pool: Any) -> None:
    work, done = pool
    assert work.take("ns/box")
    assert work.note_change("ns/box", "11")  # the watch brought the work's own write
    work.note_own("ns/box", "11")
    work.let_go("ns/box", settled=True)
    assert not done.is_set(), "the work's own write, seen by the watch, woke a pass"
    assert work.take("ns/box")
    assert work.note_change("ns/box", "12")  # someone else's change meanwhile
    work.note_own("ns/box", "13")
    work.let_go("ns/box", settled=True)
    assert done.is_set(), "a change held for the end of the work was never looked at"
    assert not work.note_change("ns/box", "14"), "held with no work running"


def test_a_change_of_mode_waiting_at_the_end_and_not_handed_over_asks_for_a_pass(
    pool: Any,
) -> None:
    work, done = pool
    work.ended = lambda _key: True
    assert work.take("ns/box")
    work.let_go("ns/box", settled=True)
    assert done.is_set()


class Paused:
    """A Running sandbox whose spec asks for Paused, over the in-memory runtime."""

    def __init__(self) -> None:
        clock = FakeClock(T0)
        self.objects = FakeObjects(clock.now)
        self.rt = FakeRuntime()
        self.info = self.rt.add("c1", {"sandlot.dev/sandbox": "ns/box"}, state=TaskState.RUNNING)
        self.objects.add_sandbox("ns", "box", T0, node="node-a", phase="Running")
        self.objects.sandboxes["ns/box"]["spec"]["operatingMode"] = "Paused"
        status = StatusWriter(self.objects, "node-a", clock.now)  # type: ignore[arg-type]
        self.modes = ModeChanges(self.rt, status, "node-a", call_timeout=0.2)

    def settle(self) -> object:
        return self.modes.settle(self.objects.get_sandbox("ns", "box"), self.info)


def test_a_pause_recorded_answers_settled_and_one_not_recorded_does_not() -> None:
    assert Paused().settle() is SETTLED
    streamed = Paused()
    streamed.modes.in_use = lambda: {"ns/box"}
    assert streamed.settle() is ModeStep.WAIT
    unwritten = Paused()
    unwritten.objects.sandboxes["ns/box"]["status"]["phase"] = "Stopped"
    assert unwritten.settle() is ModeStep.PAUSE, "a record skipped was taken as written"
