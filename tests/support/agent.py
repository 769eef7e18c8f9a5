"""An in-memory ``Runtime`` for agent policy tests, at the project's own boundary.

Containers and tasks live in dicts. A container can be marked *wedged*: like a
stopped containerd shim, every call about its task then answers nothing until the
caller's deadline passes on the runtime's ``ShimClock``, and raises
``RuntimeTimeout`` (the real adapter's behaviour under a gRPC deadline). A paused
task takes only SIGKILL (runc thaws what it kills; any other signal waits for a
resume). Nothing here waits longer than the timeout it is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sandlot.adapters.runtime import (
    UNSUPPORTED,
    ContainerInfo,
    ContainerSpec,
    ExitStatus,
    ImageConfig,
    ImageRecord,
    NotFound,
    RuntimeError_,
    RuntimeTimeout,
    TaskInfo,
    TaskState,
)

SAFETY = 30.0
"""Real seconds a ShimClock waits for its threads before it calls the test broken."""


class ShimClock:
    """Virtual time for wedged calls: a wedged call hangs until the clock reaches its
    deadline, and the clock moves only when every busy worker hangs, to the earliest
    deadline (what the calls would cost on a real clock, with no real waiting)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.peak = 0
        """The most calls hanging at once."""
        self.finished = 0
        self._hanging: list[float] = []
        self._cond = threading.Condition()

    def hang(self, timeout: float) -> None:
        with self._cond:
            deadline = self.now + timeout
            self._hanging.append(deadline)
            self.peak = max(self.peak, len(self._hanging))
            self._cond.notify_all()
            passed = self._cond.wait_for(lambda: self.now >= deadline, timeout=SAFETY)
            self._hanging.remove(deadline)
            self._cond.notify_all()
        assert passed, f"a wedged call hung {SAFETY:g}s of real time: nothing drove the clock"

    def finish(self) -> None:
        """One worker's job is done (its ``on_done``)."""
        with self._cond:
            self.finished += 1
            self._cond.notify_all()

    def drive(self, target: Callable[[], object], busy: Callable[[int], int]) -> object:
        """Run ``target`` on a thread; whenever ``busy(finished)`` workers all hang,
        move the clock to the earliest deadline. ``target``'s result."""
        out: list[object] = []
        ended = threading.Event()

        def run() -> None:
            try:
                out.append(target())
            finally:
                with self._cond:
                    ended.set()
                    self._cond.notify_all()

        worker = threading.Thread(target=run, name="shim-clock-driven", daemon=True)
        worker.start()
        with self._cond:
            while True:
                ready = self._cond.wait_for(
                    lambda: ended.is_set() or len(self._hanging) >= busy(self.finished) > 0,
                    timeout=SAFETY,
                )
                assert ready, (
                    f"{len(self._hanging)} calls hang, {busy(self.finished)} busy workers "
                    f"should: the work does not run that many at once, or a worker is stuck "
                    f"({SAFETY:g}s of real time)"
                )
                if ended.is_set():
                    break
                self.now = max(self.now, min(self._hanging))
                self._cond.notify_all()
                released = self._cond.wait_for(
                    lambda: all(d > self.now for d in self._hanging), timeout=SAFETY
                )
                assert released, "a call whose deadline passed never returned"
        worker.join(SAFETY)
        assert out, "the driven call raised (see the thread's traceback above)"
        return out[0]


@dataclass
class _Task:
    pid: int
    state: TaskState = TaskState.RUNNING
    exit_code: int | None = None


@dataclass
class FakeRuntime:
    containers: dict[str, ContainerInfo] = field(default_factory=dict)
    tasks: dict[str, _Task] = field(default_factory=dict)
    snapshots: set[str] = field(default_factory=set)
    images: dict[str, ImageConfig] = field(default_factory=dict)
    wedged: set[str] = field(default_factory=set)
    # container id -> the directory standing in for its writable layer
    writable_dirs: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    shim_clock: ShimClock = field(default_factory=ShimClock)
    _never: threading.Event = field(default_factory=threading.Event)
    _next_pid: int = 1000

    # -- test helpers
    def add(
        self,
        container_id: str,
        labels: Mapping[str, str] | None = None,
        *,
        state: TaskState | None = TaskState.RUNNING,
        exit_code: int | None = None,
        wedged: bool = False,
    ) -> ContainerInfo:
        info = ContainerInfo(container_id, "img", dict(labels or {}), snapshot_key=container_id)
        self.containers[container_id] = info
        self.snapshots.add(container_id)
        if state is not None:
            self._next_pid += 1
            self.tasks[container_id] = _Task(self._next_pid, state, exit_code)
        if wedged:
            self.wedged.add(container_id)
        return info

    def _record(self, method: str, target: str) -> None:
        with self._lock:
            self.calls.append((method, target))

    def _hang_if_wedged(self, container_id: str, what: str, timeout: float) -> None:
        if container_id in self.wedged:
            self.shim_clock.hang(timeout)  # the shim never answers: only the deadline ends it
            raise RuntimeTimeout(f"{what} {container_id}: no answer within {timeout:g}s")

    # -- Runtime
    def version(self, *, timeout: float) -> str:
        return "fake"

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        self._record("list_containers", "")
        return list(self.containers.values())

    def list_tasks(self, *, timeout: float) -> list[TaskInfo]:
        return [
            TaskInfo(cid, t.pid, t.state, t.exit_code if t.state == TaskState.STOPPED else None)
            for cid, t in self.tasks.items()
        ]

    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        t = self.tasks.get(container_id)
        return None if t is None else TaskInfo(container_id, t.pid, t.state, t.exit_code)

    def image_config(self, image: str, *, timeout: float) -> ImageConfig:
        if image not in self.images:
            raise NotFound(f"image {image} not found")
        return self.images[image]

    def create_container(self, spec: ContainerSpec, *, timeout: float) -> ContainerInfo:
        if spec.image not in self.images:
            raise NotFound(f"image {spec.image} not found")
        return self.add(spec.id, spec.labels, state=None)

    def start_task(self, container_id: str, *, stdio: str, timeout: float) -> TaskInfo:
        self._next_pid += 1
        self.tasks[container_id] = _Task(self._next_pid)
        return TaskInfo(container_id, self._next_pid, TaskState.RUNNING)

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None:
        self._record("kill_task", container_id)
        self._hang_if_wedged(container_id, "Tasks.Kill", timeout)
        t = self.tasks.get(container_id)
        if t is None or t.state == TaskState.STOPPED:
            raise NotFound(f"task {container_id}: process already finished")
        if t.state == TaskState.PAUSED and signal != 9:
            return  # frozen: the signal waits for a resume
        t.state, t.exit_code = TaskState.STOPPED, 128 + signal

    def pause_task(self, container_id: str, *, timeout: float) -> None:
        self._record("pause_task", container_id)
        self._hang_if_wedged(container_id, "Tasks.Pause", timeout)
        t = self.tasks.get(container_id)
        if t is None:
            raise NotFound(f"task {container_id}")
        if t.state != TaskState.RUNNING:
            raise RuntimeError_(f"Tasks.Pause {container_id}: task is {t.state}", "unknown")
        t.state = TaskState.PAUSED

    def resume_task(self, container_id: str, *, timeout: float) -> None:
        self._record("resume_task", container_id)
        self._hang_if_wedged(container_id, "Tasks.Resume", timeout)
        t = self.tasks.get(container_id)
        if t is None:
            raise NotFound(f"task {container_id}")
        if t.state != TaskState.PAUSED:
            raise RuntimeError_(f"Tasks.Resume {container_id}: task is {t.state}", "unknown")
        t.state = TaskState.RUNNING

    def wait_task(self, container_id: str, *, timeout: float) -> ExitStatus:
        self._record("wait_task", container_id)
        self._hang_if_wedged(container_id, "Tasks.Wait", timeout)
        t = self.tasks.get(container_id)
        if t is None:
            raise NotFound(f"task {container_id}")
        if t.state != TaskState.STOPPED:
            self._never.wait(timeout)
            raise RuntimeTimeout(f"Tasks.Wait {container_id}: no exit within {timeout:g}s")
        return ExitStatus(t.exit_code or 0, datetime.now(UTC))

    def delete_task(self, container_id: str, *, timeout: float) -> ExitStatus | None:
        self._record("delete_task", container_id)
        self._hang_if_wedged(container_id, "Tasks.Delete", timeout)
        t = self.tasks.pop(container_id, None)
        if t is None:
            raise NotFound(f"task {container_id}")
        return None if t.exit_code is None else ExitStatus(t.exit_code, datetime.now(UTC))

    def delete_container(self, container_id: str, *, timeout: float) -> None:
        self._record("delete_container", container_id)
        if self.containers.pop(container_id, None) is None:
            raise NotFound(f"container {container_id}")

    def remove_snapshot(self, key: str, *, timeout: float) -> None:
        self._record("remove_snapshot", key)
        if key not in self.snapshots:
            raise NotFound(f"snapshot {key}")
        self.snapshots.discard(key)

    def commit_container(
        self, container_id: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        self._record("commit_container", container_id)
        self._hang_if_wedged(container_id, "Diff.Diff", timeout)
        info = self.containers.get(container_id)
        if info is None:
            raise NotFound(f"container {container_id}")
        self.images[image] = self.images.get(info.image, ImageConfig())
        return "sha256:" + "0" * 64

    def copy_image(
        self, source: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        self._record("copy_image", source)
        if source not in self.images:
            raise NotFound(f"image {source}")
        self.images[image] = self.images[source]
        return "sha256:" + "0" * 64

    def image_manifest(self, image: str, *, timeout: float) -> tuple[bytes, str]:
        self._record("image_manifest", image)
        if image not in self.images:
            raise NotFound(f"image {image}")
        raise RuntimeError_(f"image {image}: no content in memory", UNSUPPORTED)

    def open_blob(self, digest: str, *, timeout: float) -> Iterator[bytes]:
        self._record("open_blob", digest)
        raise NotFound(f"blob {digest}")  # the content store holds nothing

    def writable_layer(self, container_id: str, *, timeout: float) -> str:
        self._record("writable_layer", container_id)
        if container_id not in self.containers:
            raise NotFound(f"container {container_id}")
        if container_id not in self.writable_dirs:
            raise RuntimeError_(f"container {container_id}: no writable directory", UNSUPPORTED)
        return self.writable_dirs[container_id]

    def list_images(self, *, timeout: float) -> list[ImageRecord]:
        return []

    def delete_image(self, name: str, *, timeout: float) -> None:
        raise NotFound(name)

    def collect_garbage(self, *, timeout: float) -> None:
        return None

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        return None

    def close(self) -> None:
        return None
