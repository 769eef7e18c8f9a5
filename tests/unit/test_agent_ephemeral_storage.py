"""The storage pass at the agent's own boundary (an in-memory ``Runtime`` and API):
it measures only live containers with a limit, ends one over it Failed before it
tears it down, and judges nothing it could not measure."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandlot.adapters.runtime import ContainerInfo, RuntimeTimeout, TaskState
from sandlot.agent.ephemeralstorage import EphemeralStorage
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.status import StatusWriter
from sandlot.agent.teardown import teardown
from sandlot.api.keys import EPHEMERAL_STORAGE_LABEL, SANDBOX_LABEL, SANDBOX_UID_LABEL
from sandlot.api.reasons import SandboxReason
from tests.support.agent import FakeRuntime
from tests.support.fakeobjects import FakeObjects

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NODE = "n1"
MI = 2**20


class InlinePool:
    """Runs each submitted item at once (one key at a time holds trivially)."""

    def __init__(self) -> None:
        self.busy_keys: set[str] = set()

    def busy(self, key: str) -> bool:
        return key in self.busy_keys

    def submit(self, key: str, work: Callable[[], object]) -> bool:
        work()
        return True


class Work:
    """What the pass uses of ``SandboxWork``: its API, status writer, metrics, teardown."""

    def __init__(self, rt: FakeRuntime, objects: FakeObjects) -> None:
        self.rt = rt
        self.objects = objects
        self.status = StatusWriter(objects, NODE, lambda: T0)  # type: ignore[arg-type]
        self.metrics = AgentMetrics(CollectorRegistry())
        self.call_timeout = 0.2
        self.torn_down: list[str] = []

    def teardown(self, container: ContainerInfo) -> None:
        self.torn_down.append(container.id)
        teardown(self.rt, container, kill_wait=0.2, call_timeout=0.2)


class World:
    def __init__(self, tmp_path: Path, max_entries: int = 1000) -> None:
        self.tmp = tmp_path
        self.rt = FakeRuntime()
        self.objects = FakeObjects(lambda: T0)
        self.work = Work(self.rt, self.objects)
        self.pool = InlinePool()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.guard = EphemeralStorage(
            self.rt,
            self.pool,  # type: ignore[arg-type]
            self.work,  # type: ignore[arg-type]
            str(self.logs),
            max_entries=max_entries,
        )

    def sandbox(
        self, name: str, *, limit: int | None, wrote: int = 0, state: TaskState = TaskState.RUNNING
    ) -> str:
        """A Running sandbox whose container wrote ``wrote`` bytes; its container id."""
        body = self.objects.add_sandbox("ns", name, T0, node=NODE, phase="Running")
        uid = body["metadata"]["uid"]
        labels = {SANDBOX_LABEL: f"ns/{name}", SANDBOX_UID_LABEL: uid}
        if limit is not None:
            labels[EPHEMERAL_STORAGE_LABEL] = str(limit)
        cid = f"sb-{uid}"
        self.rt.add(cid, labels, state=state)
        layer = self.tmp / "layers" / cid
        layer.mkdir(parents=True)
        (layer / "data").write_bytes(b"x" * wrote)
        self.rt.writable_dirs[cid] = str(layer)
        return cid

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.objects.sandboxes[f"ns/{name}"]["status"])


def test_a_sandbox_over_its_limit_ends_failed_and_is_torn_down(tmp_path: Path) -> None:
    world = World(tmp_path)
    hog = world.sandbox("hog", limit=MI, wrote=2 * MI)
    roomy = world.sandbox("roomy", limit=8 * MI, wrote=2 * MI)
    assert world.guard.pass_once() == 1
    status = world.status("hog")
    assert (status["phase"], status["reason"]) == (
        "Failed",
        SandboxReason.EPHEMERAL_STORAGE_EXCEEDED,
    )
    assert "over its limit of 1.0Mi" in status["message"], status
    assert world.work.torn_down == [hog] and hog not in world.rt.containers
    assert world.status("roomy")["phase"] == "Running"
    assert world.guard.measured[roomy].bytes >= 2 * MI


def test_its_log_files_count_too(tmp_path: Path) -> None:
    world = World(tmp_path)
    cid = world.sandbox("chatty", limit=MI, wrote=0)
    uid = world.rt.containers[cid].labels[SANDBOX_UID_LABEL]
    (world.logs / f"ns_chatty_{uid}.log").write_bytes(b"y" * (MI // 2))
    (world.logs / f"ns_chatty_{uid}.log.1").write_bytes(b"y" * MI)
    world.guard.pass_once()
    assert world.status("chatty")["reason"] == SandboxReason.EPHEMERAL_STORAGE_EXCEEDED


def test_only_live_containers_with_a_limit_are_measured(tmp_path: Path) -> None:
    world = World(tmp_path)
    unlimited = world.sandbox("free", limit=None, wrote=2 * MI)
    exited = world.sandbox("done", limit=MI, wrote=2 * MI, state=TaskState.STOPPED)
    paused = world.sandbox("frozen", limit=MI, wrote=2 * MI, state=TaskState.PAUSED)
    assert world.guard.pass_once() == 1
    assert set(world.guard.measured) == {paused}
    assert ("writable_layer", unlimited) not in world.rt.calls
    assert ("writable_layer", exited) not in world.rt.calls  # the reaper's
    assert world.status("frozen")["reason"] == SandboxReason.EPHEMERAL_STORAGE_EXCEEDED


def test_a_sandbox_already_ended_is_left_to_the_sync(tmp_path: Path) -> None:
    world = World(tmp_path)
    cid = world.sandbox("ended", limit=MI, wrote=2 * MI)
    world.objects.sandboxes["ns/ended"]["status"] = {"phase": "Stopped", "reason": "Exited"}
    world.guard.pass_once()
    assert world.status("ended")["reason"] == "Exited"
    assert world.work.torn_down == [] and cid in world.rt.containers


def test_a_sandbox_busy_with_other_work_is_not_measured(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.sandbox("busy", limit=MI, wrote=2 * MI)
    world.pool.busy_keys.add("ns/busy")
    assert world.guard.pass_once() == 0
    assert world.guard.measured == {}


def test_a_layer_containerd_cannot_name_now_is_judged_on_a_later_pass(tmp_path: Path) -> None:
    world = World(tmp_path)
    cid = world.sandbox("slow", limit=MI, wrote=2 * MI)
    answer = world.rt.writable_dirs.pop(cid)
    original = world.rt.writable_layer

    def silent(container_id: str, *, timeout: float) -> str:
        raise RuntimeTimeout(f"Snapshots.Mounts {container_id}: no answer")

    world.rt.writable_layer = silent  # type: ignore[method-assign]
    assert world.guard.pass_once() == 0 and world.guard.measured == {}
    world.rt.writable_layer = original  # type: ignore[method-assign]
    world.rt.writable_dirs[cid] = answer
    assert world.guard.pass_once() == 1


def test_a_snapshotter_without_a_writable_directory_leaves_the_logs_counted(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    cid = world.sandbox("native", limit=MI, wrote=2 * MI)
    del world.rt.writable_dirs[cid]  # the fake then answers "unsupported"
    assert world.guard.pass_once() == 0
    assert world.guard.measured[cid].bytes == 0


def test_more_files_than_one_walk_visits_count_as_over(tmp_path: Path) -> None:
    world = World(tmp_path, max_entries=10)
    cid = world.sandbox("many", limit=8 * MI)
    for i in range(20):
        (Path(world.rt.writable_dirs[cid]) / f"f{i}").touch()
    world.guard.pass_once()
    status = world.status("many")
    assert status["reason"] == SandboxReason.EPHEMERAL_STORAGE_EXCEEDED
    assert "more than 10 files" in status["message"], status


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_growing_sandbox_is_measured_again_before_the_interval(tmp_path: Path) -> None:
    world = World(tmp_path)
    clock = FakeClock()
    world.guard.clock = clock
    world.guard.interval = 10.0
    writer = world.sandbox("writer", limit=32 * MI, wrote=4 * MI)
    quiet = world.sandbox("quiet", limit=32 * MI, wrote=MI)
    data = Path(world.rt.writable_dirs[writer]) / "data"
    world.guard.pass_once()
    assert world.guard.seconds_to_next() == 10.0  # first sight: no rate yet
    clock.now += 10.0
    data.write_bytes(b"x" * 24 * MI)  # 2 MiB/s, 8 MiB to go: 4 s away
    assert world.guard.step() == pytest.approx(2.0, abs=0.01)  # blocks: not exactly
    clock.now += 2.0
    data.write_bytes(b"x" * 28 * MI)  # still 2 MiB/s: 2 s away, measured in 1
    assert world.guard.step() == pytest.approx(1.0, abs=0.01)
    assert set(world.guard.measured) == {writer}  # the quiet one is not due yet
    clock.now += 1.0
    data.write_bytes(b"x" * 33 * MI)
    assert world.guard.pass_once() == 1
    assert world.status("writer")["reason"] == SandboxReason.EPHEMERAL_STORAGE_EXCEEDED
    assert world.status("quiet")["phase"] == "Running" and quiet in world.rt.containers
