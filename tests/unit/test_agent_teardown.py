"""Bounded teardown over an in-memory runtime whose wedged containers never answer.

Wedged calls wait out their deadlines on the runtime's virtual ``ShimClock``: the
times asserted are what the deadlines add up to, exactly, not how fast a machine is.
"""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from sandlot.adapters.runtime import NotFound, RuntimeError_, RuntimeTimeout, TaskInfo, TaskState
from sandlot.agent.teardown import TeardownOutcome, TeardownResult, stop, teardown, teardown_many
from tests.support.agent import FakeRuntime

KILL_WAIT = 0.3
CALL = 0.1
BOUND = KILL_WAIT + 4 * CALL
"""The documented worst case of one teardown."""
WEDGED = CALL + KILL_WAIT + CALL
"""What a wedged one costs: kill, the exit wait and the task delete each wait out
their deadline; its container and snapshot are kept, so those calls are not made."""


def test_clean_teardown_removes_task_container_and_snapshot() -> None:
    rt = FakeRuntime()
    rt.add("c1")
    result = teardown(rt, "c1", kill_wait=KILL_WAIT, call_timeout=CALL)
    assert result.outcome is TeardownOutcome.CLEAN
    assert result.exit_status is not None and result.exit_status.code == 128 + signal.SIGKILL
    assert not rt.containers and not rt.tasks and not rt.snapshots


def test_already_gone_pieces_are_fine() -> None:
    rt = FakeRuntime()
    rt.add("c1", state=None)
    rt.snapshots.clear()
    assert teardown(rt, "c1", kill_wait=KILL_WAIT, call_timeout=CALL).outcome is (
        TeardownOutcome.CLEAN
    )
    assert teardown(rt, "never-existed", kill_wait=KILL_WAIT, call_timeout=CALL).outcome is (
        TeardownOutcome.CLEAN
    )


def test_exited_task_keeps_its_exit_code() -> None:
    rt = FakeRuntime()
    rt.add("c1", state=TaskState.STOPPED, exit_code=3)
    result = teardown(rt, "c1", kill_wait=KILL_WAIT, call_timeout=CALL)
    assert result.outcome is TeardownOutcome.CLEAN
    assert result.exit_status is not None and result.exit_status.code == 3


def test_wedged_shim_is_bounded_and_the_warning_names_the_container(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = FakeRuntime()
    rt.add("wedged-1", wedged=True)
    with caplog.at_level(logging.WARNING, logger="sandlot.agent.teardown"):
        result = rt.shim_clock.drive(
            lambda: teardown(rt, "wedged-1", kill_wait=KILL_WAIT, call_timeout=CALL),
            busy=lambda finished: 1,
        )
    assert isinstance(result, TeardownResult)
    assert result.outcome is TeardownOutcome.KILL_WAIT_TIMEOUT
    assert rt.shim_clock.now == pytest.approx(WEDGED), "a call waited past its deadline"
    assert WEDGED <= BOUND
    assert any(
        "wedged-1" in r.getMessage() and "kill wait" in r.getMessage() for r in caplog.records
    )
    # It went on past the missing exit, but kept the record of a task it could not delete,
    # so the next sweep still sees the container instead of a shim nobody can find.
    assert ("delete_task", "wedged-1") in rt.calls
    assert "wedged-1" in rt.containers
    rt.wedged.clear()  # the shim recovers: the next teardown finishes the job
    assert teardown(rt, "wedged-1", kill_wait=KILL_WAIT, call_timeout=CALL).outcome is (
        TeardownOutcome.CLEAN
    )
    assert "wedged-1" not in rt.containers and "wedged-1" not in rt.snapshots


def test_twenty_wedged_with_concurrency_eight_take_three_bounds_not_twenty() -> None:
    rt = FakeRuntime()
    clock = rt.shim_clock
    for i in range(20):
        rt.add(f"w{i}", wedged=True)
    threads_before = threading.active_count()
    results = clock.drive(
        lambda: teardown_many(
            rt,
            [f"w{i}" for i in range(20)],
            kill_wait=KILL_WAIT,
            call_timeout=CALL,
            concurrency=8,
            on_done=lambda _: clock.finish(),
        ),
        busy=lambda finished: min(8, 20 - finished),
    )
    assert isinstance(results, list)
    assert [r.outcome for r in results] == [TeardownOutcome.KILL_WAIT_TIMEOUT] * 20
    assert clock.peak == 8, f"{clock.peak} wedged calls hung at once, not the pool's 8"
    assert clock.now == pytest.approx(3 * WEDGED), (
        f"{clock.now:.2f}s of deadlines for 20 wedged, 8 at a time ({WEDGED:.2f}s each)"
    )
    # The pool's threads are gone when it returns: nothing is left behind by wedged calls.
    assert threading.active_count() <= threads_before


def test_one_wedged_shim_delays_nothing_else() -> None:
    rt = FakeRuntime()
    clock = rt.shim_clock
    rt.add("wedged", wedged=True)
    for i in range(10):
        rt.add(f"ok{i}")
    done_at: dict[str, float] = {}

    def done(result: TeardownResult) -> None:
        done_at[result.container_id] = clock.now
        clock.finish()

    clock.drive(
        lambda: teardown_many(
            rt,
            ["wedged", *(f"ok{i}" for i in range(10))],
            kill_wait=KILL_WAIT,
            call_timeout=CALL,
            concurrency=2,
            on_done=done,
        ),
        busy=lambda finished: min(2, 11 - finished),
    )
    assert len(done_at) == 11, f"not every teardown finished: {sorted(done_at)}"
    assert {t for c, t in done_at.items() if c != "wedged"} == {0.0}, done_at
    assert done_at["wedged"] == pytest.approx(WEDGED)


def test_stop_sends_sigterm_then_tears_down() -> None:
    rt = FakeRuntime()
    rt.add("c1")
    result = stop(rt, "c1", stop_grace=0.2, kill_wait=KILL_WAIT, call_timeout=CALL)
    assert rt.calls[0] == ("kill_task", "c1")
    assert result.exit_status is not None and result.exit_status.code == 128 + signal.SIGTERM
    assert not rt.containers


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        teardown_many(FakeRuntime(), ["x"], kill_wait=1, call_timeout=1, concurrency=0)


class _LookupFails(FakeRuntime):
    """Kill says "no such process" but the task lookup fails (a shim that stopped
    answering between the two calls, containerd busy): the task may be alive."""

    def __init__(self, error: RuntimeError_) -> None:
        super().__init__()
        self.error = error

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None:
        self._record("kill_task", container_id)
        raise NotFound(f"task {container_id}: process already finished")

    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        self._record("get_task", container_id)
        raise self.error


@pytest.mark.parametrize(
    "error",
    [RuntimeTimeout("Tasks.Get c1: no answer"), RuntimeError_("Tasks.Get c1: UNAVAILABLE")],
    ids=["lookup-times-out", "lookup-errs"],
)
def test_failed_task_lookup_counts_as_a_live_task_and_keeps_the_container(
    error: RuntimeError_,
) -> None:
    rt = _LookupFails(error)
    rt.add("c1")
    result = teardown(rt, "c1", kill_wait=KILL_WAIT, call_timeout=CALL)
    assert ("get_task", "c1") in rt.calls, "the lookup under test was never made"
    assert "c1" in rt.containers, "a container whose task may be alive was deleted"
    assert "c1" in rt.snapshots
    assert ("delete_container", "c1") not in rt.calls
    assert result.outcome is TeardownOutcome.ERROR
    assert any("get task" in e for e in result.errors), result.errors


def test_task_lookup_saying_none_lets_the_container_go() -> None:
    rt = FakeRuntime()
    rt.add("c1", state=None)  # no task at all: kill answers NotFound, the lookup None
    result = teardown(rt, "c1", kill_wait=KILL_WAIT, call_timeout=CALL)
    assert "c1" not in rt.containers
    assert result.outcome is TeardownOutcome.CLEAN
