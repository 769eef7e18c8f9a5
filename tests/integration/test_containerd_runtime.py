"""ContainerdRuntime against a real, private containerd: tasks, exits, shims, images.

Each test names its own containers and cleans them up, so the session's
containerd can be shared. Timing bounds are generous (shared CI machines); they
check that a call is bounded, not how fast it is.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.containerd.connection import Connection
from sandlot.adapters.containerd.images import Images
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import (
    ContainerSpec,
    NotFound,
    RuntimeError_,
    RuntimeTimeout,
    TaskState,
)
from tests.support.containerd import (
    PrivateContainerd,
    find_shim_pid,
    scratch_spec,
    stopped_process,
)
from tests.support.containerd_fixtures import EVERY_CONTAINERD, LINE_OS
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration, EVERY_CONTAINERD]

ImageFactory = Callable[..., str]  # see tests.support.containerd_fixtures.image_factory

# A shell that exits 143 on SIGTERM: as PID 1 of its namespace, sh would ignore it otherwise.
TRAPPING_SHELL = ["sh", "-c", 'trap "exit 143" TERM; echo hi; sleep 1000 & wait']
SLACK = 1.5  # seconds allowed beyond a deadline for scheduling on a busy machine


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _teardown(runtime: ContainerdRuntime, container_id: str) -> None:
    """Best-effort cleanup with short deadlines (a test may have left anything behind)."""
    steps: list[Callable[[], object]] = [
        lambda: runtime.kill_task(container_id, signal.SIGKILL, timeout=3),
        lambda: runtime.wait_task(container_id, timeout=5),
        lambda: runtime.delete_task(container_id, timeout=5),
        lambda: runtime.delete_container(container_id, timeout=5),
        lambda: runtime.remove_snapshot(container_id, timeout=5),
    ]
    for step in steps:
        with contextlib.suppress(RuntimeError_):
            step()


@pytest.fixture
def run_container(
    runtime: ContainerdRuntime, busybox_image: str, tmp_path: Path
) -> Iterator[object]:
    """``start(prefix, args) -> (container_id, task, log_path)``; torn down after the test."""
    started: list[str] = []

    def start(prefix: str, args: list[str]) -> tuple[str, object, Path]:
        container_id = _new_id(prefix)
        spec = scratch_spec(args, container_id, host_network=False)
        started.append(container_id)
        runtime.create_container(
            ContainerSpec(id=container_id, image=busybox_image, oci_spec=spec), timeout=10
        )
        log_path = tmp_path / "logs" / f"{container_id}.log"
        task = runtime.start_task(container_id, stdio=f"file://{log_path}", timeout=10)
        return container_id, task, log_path

    yield start
    for container_id in started:
        _teardown(runtime, container_id)


def _log_contains(path: Path, text: str) -> bool:
    try:
        return text in path.read_text()
    except FileNotFoundError:
        return False


def test_version_names_the_daemon(
    runtime: ContainerdRuntime, containerd: PrivateContainerd
) -> None:
    version = runtime.version(timeout=5)
    assert version.lstrip("v").startswith(f"{containerd.line}."), version


def test_imported_image_is_listed_with_its_content_size(
    runtime: ContainerdRuntime, busybox_image: str
) -> None:
    records = {r.name: r for r in runtime.list_images(timeout=10)}
    assert busybox_image in records, f"{busybox_image} not in {sorted(records)}"
    record = records[busybox_image]
    assert record.size > 500_000  # a static busybox is about 2 MB
    assert record.target_digest.startswith("sha256:")
    assert record.updated_at >= record.created_at


def test_image_config_comes_from_the_image(runtime: ContainerdRuntime, busybox_image: str) -> None:
    config = runtime.image_config(busybox_image, timeout=10)
    assert config.cmd == ("/bin/sh",)
    assert any(e.startswith("PATH=") for e in config.env)


class CountedReads(Connection):
    """The real connection, counting the blobs it reads from the content store."""

    def __init__(self, address: str, namespace: str) -> None:
        super().__init__(address, namespace)
        self.reads: list[str] = []

    def read_blob(self, digest: str, *, timeout: float, what: str, limit: int) -> bytes:
        self.reads.append(digest)
        return super().read_blob(digest, timeout=timeout, what=what, limit=limit)


def test_an_images_documents_are_read_once_and_its_record_every_time(
    containerd: PrivateContainerd, image_factory: ImageFactory
) -> None:
    """A start reads its image's config twice (its OCI spec, its snapshot's parent):
    the manifest and config come from the content store once per digest, while the
    record is read on every call, so a name moved to other content is read as that."""
    conn = CountedReads(containerd.address, containerd.namespace)
    images = Images(conn)
    name = image_factory("docker.io/sandlot/moved:1", salt="moved-a", cmd=["/bin/echo", "a"])
    try:
        assert images.image_config(name, timeout=10).cmd == ("/bin/echo", "a")
        budget = Deadline(10, expired=RuntimeTimeout)
        assert images.config_json(name, budget)["rootfs"]["diff_ids"]
        assert images.image_config(name, timeout=10).cmd == ("/bin/echo", "a")
        assert len(conn.reads) == 2, conn.reads  # its manifest and its config, once each

        images.delete_image(name, timeout=10)
        image_factory(name, salt="moved-b", cmd=["/bin/echo", "b"])
        assert images.image_config(name, timeout=10).cmd == ("/bin/echo", "b")
        assert len(conn.reads) == 4, conn.reads
    finally:
        with contextlib.suppress(NotFound):
            images.delete_image(name, timeout=10)
        conn.close()


def test_started_task_runs_and_logs_to_its_file(runtime: ContainerdRuntime, run_container) -> None:
    began = time.monotonic()
    container_id, task, log_path = run_container("run", ["sh", "-c", "echo hi; sleep 1000"])
    elapsed = time.monotonic() - began
    assert task.pid > 0
    assert task.state == TaskState.RUNNING
    got = runtime.get_task(container_id, timeout=5)
    assert got is not None and got.state == TaskState.RUNNING and got.pid == task.pid
    assert container_id in {t.container_id for t in runtime.list_tasks(timeout=5)}
    assert container_id in {c.id for c in runtime.list_containers(timeout=5)}
    wait_for(lambda: _log_contains(log_path, "hi"), timeout=10, what=f"'hi' in {log_path}")
    print(f"container create+start took {elapsed:.3f}s")


def test_sigterm_then_wait_gives_the_exit_status_and_teardown_removes_everything(
    runtime: ContainerdRuntime, run_container
) -> None:
    container_id, _, log_path = run_container("term", TRAPPING_SHELL)
    wait_for(lambda: _log_contains(log_path, "hi"), timeout=10, what="the trap to be set")

    runtime.kill_task(container_id, signal.SIGTERM, timeout=5)
    status = runtime.wait_task(container_id, timeout=10)
    assert status.code == 143
    assert status.exited_at is not None

    deleted = runtime.delete_task(container_id, timeout=5)
    assert deleted is not None and deleted.code == 143
    runtime.delete_container(container_id, timeout=5)
    # Unreferenced once its container is gone, the snapshot may already have been
    # collected by containerd's garbage collector (a mutation count, not this test,
    # decides when it runs); teardown takes NotFound as done, and so does this.
    with contextlib.suppress(NotFound):
        runtime.remove_snapshot(container_id, timeout=5)

    assert runtime.get_task(container_id, timeout=5) is None
    assert container_id not in {t.container_id for t in runtime.list_tasks(timeout=5)}
    assert container_id not in {c.id for c in runtime.list_containers(timeout=5)}
    assert container_id not in runtime.list_snapshots(timeout=5)


def test_sigkill_exit_status_is_137(runtime: ContainerdRuntime, run_container) -> None:
    container_id, _, _ = run_container("kill", ["sleep", "1000"])
    runtime.kill_task(container_id, signal.SIGKILL, timeout=5)
    assert runtime.wait_task(container_id, timeout=10).code == 137
    stopped = runtime.get_task(container_id, timeout=5)
    assert stopped is not None and stopped.state == TaskState.STOPPED
    assert stopped.exit_status == 137


def test_wait_on_a_running_task_times_out_within_its_deadline(
    runtime: ContainerdRuntime, run_container
) -> None:
    container_id, _, _ = run_container("wait", ["sleep", "1000"])
    began = time.monotonic()
    with pytest.raises(RuntimeTimeout, match=container_id):
        runtime.wait_task(container_id, timeout=0.5)
    assert time.monotonic() - began < 0.5 + SLACK


def test_wedged_shim_kill_times_out_and_listing_still_answers(
    runtime: ContainerdRuntime, run_container, containerd: PrivateContainerd
) -> None:
    container_id, task, _ = run_container("wedged", ["sleep", "1000"])
    shim = find_shim_pid(containerd.address, container_id, task.pid)
    with stopped_process(shim):
        began = time.monotonic()
        with pytest.raises(RuntimeTimeout, match=container_id):
            runtime.kill_task(container_id, signal.SIGKILL, timeout=2)
        kill_elapsed = time.monotonic() - began
        assert kill_elapsed < 2 + SLACK, f"kill_task took {kill_elapsed:.2f}s with timeout 2"

        # containerd gives up on a silent shim after about 2 s: 1.6 reports the task
        # UNKNOWN, 2.x leaves it out of the list. Never STOPPED, the state the
        # reaper acts on (a container without a listed task is left alone too).
        began = time.monotonic()
        tasks = {t.container_id: t for t in runtime.list_tasks(timeout=10)}
        list_elapsed = time.monotonic() - began
        if containerd.line == LINE_OS:
            assert container_id in tasks
        if container_id in tasks:
            assert tasks[container_id].state in (TaskState.UNKNOWN, TaskState.RUNNING)
        print(f"wedged kill bounded at {kill_elapsed:.2f}s; list_tasks took {list_elapsed:.2f}s")


def test_missing_image_raises_not_found_naming_it(runtime: ContainerdRuntime) -> None:
    image = "docker.io/sandlot/never-imported:1"
    spec = scratch_spec(["true"], "x", host_network=True)
    with pytest.raises(NotFound, match="never-imported"):
        runtime.create_container(
            ContainerSpec(id=_new_id("missing"), image=image, oci_spec=spec), timeout=5
        )


def test_image_labels_persist(runtime: ContainerdRuntime, image_factory: ImageFactory) -> None:
    name = image_factory("docker.io/sandlot/labelled:1", salt="labels")
    runtime.set_image_labels(name, {"sandlot.dev/last-used": "2026-01-01T00:00:00Z"}, timeout=5)
    runtime.set_image_labels(name, {"sandlot.dev/other": "x"}, timeout=5)
    record = {r.name: r for r in runtime.list_images(timeout=10)}[name]
    assert record.labels["sandlot.dev/last-used"] == "2026-01-01T00:00:00Z"
    assert record.labels["sandlot.dev/other"] == "x"  # a second update keeps the first


def test_distinct_images_have_distinct_sizes_and_delete_removes_one(
    runtime: ContainerdRuntime, image_factory: ImageFactory
) -> None:
    small = image_factory("docker.io/sandlot/filler:small", salt="s", filler_bytes=1_000)
    big = image_factory("docker.io/sandlot/filler:big", salt="b", filler_bytes=300_000)
    sizes = {r.name: r.size for r in runtime.list_images(timeout=10)}
    assert sizes[big] - sizes[small] >= 290_000  # tar pads to 10 KiB records

    runtime.delete_image(big, timeout=10)
    names = {r.name for r in runtime.list_images(timeout=10)}
    assert big not in names and small in names
    with pytest.raises(NotFound, match="filler:big"):
        runtime.delete_image(big, timeout=5)


def test_container_from_a_multi_layer_index_image_runs_this_platforms_manifest(
    runtime: ContainerdRuntime, image_factory: ImageFactory, tmp_path: Path
) -> None:
    """The index names another platform whose content is absent: picking it would fail."""
    image = image_factory(
        "docker.io/sandlot/indexed:1",
        as_index=True,
        extra_files={"/etc/greeting": b"from the second layer\n"},
    )
    record = {r.name: r for r in runtime.list_images(timeout=10)}[image]
    assert record.size > 500_000

    container_id = _new_id("indexed")
    spec = scratch_spec(["cat", "/etc/greeting"], container_id, host_network=True)
    try:
        runtime.create_container(
            ContainerSpec(id=container_id, image=image, oci_spec=spec), timeout=10
        )
        log_path = tmp_path / f"{container_id}.log"
        runtime.start_task(container_id, stdio=f"file://{log_path}", timeout=10)
        assert runtime.wait_task(container_id, timeout=10).code == 0
        assert "from the second layer" in log_path.read_text()
    finally:
        _teardown(runtime, container_id)


def test_wedged_shim_teardown_calls_are_each_bounded(
    runtime: ContainerdRuntime, run_container, containerd: PrivateContainerd
) -> None:
    container_id, task, _ = run_container("wedged-td", ["sleep", "1000"])
    shim = find_shim_pid(containerd.address, container_id, task.pid)
    with stopped_process(shim):
        calls: list[tuple[str, Callable[[], object]]] = [
            ("wait_task", lambda: runtime.wait_task(container_id, timeout=1)),
            ("delete_task", lambda: runtime.delete_task(container_id, timeout=1)),
        ]
        for name, call in calls:
            began = time.monotonic()
            with pytest.raises(RuntimeTimeout, match=container_id):
                call()
            elapsed = time.monotonic() - began
            assert elapsed < 1 + SLACK, f"{name} took {elapsed:.2f}s with timeout 1"
