"""Graceful stops beside the bounded pool: one key at a time across both, and a
long grace that a stopping agent lets go of."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from sandlot.adapters.runtime import TaskState
from sandlot.agent import teardown as teardown_steps
from sandlot.agent.teardown import StopInterrupted, stop
from sandlot.agent.workpools import SandboxPools
from tests.support.agent import FakeRuntime


@pytest.fixture
def pools() -> Iterator[SandboxPools]:
    made = SandboxPools(1, 4, threading.Event(), threading.Event())
    yield made
    made.shutdown()


@pytest.mark.parametrize("first_graceful", [True, False], ids=["graceful-first", "bounded-first"])
def test_a_key_never_has_work_in_both_pools(pools: SandboxPools, first_graceful: bool) -> None:
    release = threading.Event()
    assert pools.submit("ns/a", lambda: release.wait(5), graceful=first_graceful)
    try:
        assert not pools.submit("ns/a", lambda: None, graceful=not first_graceful)
        assert not pools.submit("ns/a", lambda: None, graceful=first_graceful)
        assert pools.in_flight() == frozenset({"ns/a"}) and pools.busy("ns/a")
    finally:
        release.set()


def test_graceful_stops_leave_the_bounded_pool_free(pools: SandboxPools) -> None:
    release = threading.Event()
    for i in range(4):  # every graceful worker busy with an hour-long wait
        assert pools.submit(f"ns/stop{i}", lambda: release.wait(5), graceful=True)
    started = threading.Event()
    try:
        assert pools.submit("ns/start", started.set)
        assert started.wait(2), "bounded work waited behind graceful stops"
    finally:
        release.set()


class _IgnoresTerm(FakeRuntime):
    def kill_task(self, container_id: str, signal_: int, *, timeout: float) -> None:
        if signal_ != signal.SIGTERM:
            super().kill_task(container_id, signal_, timeout=timeout)


def test_a_stopping_agent_lets_go_of_a_long_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teardown_steps, "GRACE_SLICE", 0.1)
    rt = _IgnoresTerm()
    rt.add("c1")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    began = time.monotonic()
    with pytest.raises(StopInterrupted):
        stop(rt, "c1", stop_grace=3600, kill_wait=0.1, call_timeout=0.1, cancel=cancel)
    assert time.monotonic() - began < 2
    assert "c1" in rt.containers and rt.tasks["c1"].state is TaskState.RUNNING, (
        "an interrupted stop must leave the sandbox to the next agent, untouched"
    )
