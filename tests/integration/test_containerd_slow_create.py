"""Starting a task on a real containerd whose ``runc create`` is slow, as on a
loaded node where fifty sandboxes start at once.

Each release line runs a containerd of its own whose shims find a ``runc``
wrapper first on PATH: before the real runc's ``create`` (or ``start``) it sleeps
for the seconds written in ``<subcommand>.delay`` next to it. The start is slowed
too where a test needs creation and start together to outlast one timeout: an
unslowed start takes some tens of milliseconds, too short a window to aim a slow
creation at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import ContainerSpec, RuntimeError_, RuntimeTimeout, TaskState
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from tests.support.containerd import (
    PrivateContainerd,
    scratch_spec,
    start_private_containerd,
    unavailable_reason,
)
from tests.support.containerd_fixtures import BUSYBOX_IMAGE, LINE_2, LINE_OS
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

T = 3.0  # start_task's timeout in these tests
SLACK = 3.0  # seconds allowed beyond a deadline for scheduling on a busy machine

WRAPPER = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in
    create|start)
      [ -f "{faults}/$arg.delay" ] && sleep "$(cat "{faults}/$arg.delay")"
      break
      ;;
  esac
done
exec {runc} "$@"
"""


@dataclass
class SlowRunc:
    """The containerd whose runc is the wrapper, and the wrapper's delays."""

    containerd: PrivateContainerd
    faults: Path

    def delay(self, subcommand: str, seconds: float) -> None:
        (self.faults / f"{subcommand}.delay").write_text(f"{seconds}\n")

    def clear(self) -> None:
        for path in self.faults.glob("*.delay"):
            path.unlink()


@pytest.fixture(scope="module", params=[LINE_OS, LINE_2], ids=["containerd1.6", "containerd2"])
def slow_runc(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SlowRunc]:
    line = str(request.param)
    reason = unavailable_reason(line)
    if reason is not None:
        pytest.skip(reason)
    real_runc = shutil.which("runc")
    assert real_runc is not None, "runc is not on PATH"
    faults = tmp_path_factory.mktemp("slow-runc")
    wrapper = faults / "runc"
    wrapper.write_text(WRAPPER.format(faults=faults, runc=real_runc))
    wrapper.chmod(0o755)
    from sandlot.devtools.gen_stubs import generate

    generate()  # a no-op when the stubs are current
    instance = start_private_containerd(line=line, path_prefix=faults)
    try:
        archive = faults / "busybox.tar"
        build_image_archive(archive, BUSYBOX_IMAGE)
        import_archive(instance.address, instance.namespace, archive, timeout=60, ctr=instance.ctr)
        yield SlowRunc(instance, faults)
    finally:
        instance.stop()
        instance.remove()


@pytest.fixture
def runtime(slow_runc: SlowRunc) -> Iterator[ContainerdRuntime]:
    rt = ContainerdRuntime(slow_runc.containerd.address, slow_runc.containerd.namespace)
    try:
        yield rt
    finally:
        slow_runc.clear()
        rt.close()


@pytest.fixture
def container_id(runtime: ContainerdRuntime) -> Iterator[str]:
    """A created busybox container (sleeping once started), removed after the test."""
    cid = f"slow-{uuid.uuid4().hex[:8]}"
    spec = scratch_spec(["sleep", "1000"], cid, host_network=False)
    runtime.create_container(ContainerSpec(id=cid, image=BUSYBOX_IMAGE, oci_spec=spec), timeout=10)
    yield cid
    steps: list[Callable[[], object]] = [
        lambda: runtime.kill_task(cid, signal.SIGKILL, timeout=3),
        lambda: runtime.wait_task(cid, timeout=5),
        lambda: runtime.delete_task(cid, timeout=5),
        lambda: runtime.delete_container(cid, timeout=5),
        lambda: runtime.remove_snapshot(cid, timeout=5),
    ]
    for step in steps:
        with contextlib.suppress(RuntimeError_):
            step()


def _processes_naming(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (shims, the wrapper, runc)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(text.encode() in arg for arg in argv):
                found.append(" ".join(a.decode(errors="replace") for a in argv if a))
    return found


def test_a_slow_create_leaves_the_start_a_deadline_of_its_own(
    slow_runc: SlowRunc, runtime: ContainerdRuntime, container_id: str, tmp_path: Path
) -> None:
    """Creation takes most of the timeout and the start then needs more than what
    is left of it: each is bounded by the timeout on its own, so the task runs."""
    slow_runc.delay("create", 0.65 * T)  # with the shim's and runc's own work: about 0.7 T
    slow_runc.delay("start", 0.45 * T)
    began = time.monotonic()
    task = runtime.start_task(container_id, stdio=f"file://{tmp_path / 'task.log'}", timeout=T)
    elapsed = time.monotonic() - began

    assert elapsed >= 1.1 * T, f"took {elapsed:.2f}s: runc was not slowed (wrapper not used?)"
    assert task.state == TaskState.RUNNING and task.pid > 0, task
    got = runtime.get_task(container_id, timeout=5)
    assert got is not None and got.state == TaskState.RUNNING and got.pid == task.pid, got
    print(f"start_task took {elapsed:.2f}s with a timeout of {T:g}s")


def test_a_create_slower_than_the_timeout_times_out_and_leaves_no_task(
    slow_runc: SlowRunc, runtime: ContainerdRuntime, container_id: str, tmp_path: Path
) -> None:
    """The first operation keeps its bound; containerd then removes the half-made
    task and its shim, and the container starts once runc is quick again."""
    slow_runc.delay("create", 2 * T)
    began = time.monotonic()
    with pytest.raises(RuntimeTimeout, match=r"^Tasks\.Create ") as raised:
        runtime.start_task(container_id, stdio=f"file://{tmp_path / 'task.log'}", timeout=T)
    elapsed = time.monotonic() - began
    assert elapsed < T + SLACK, f"start_task raised after {elapsed:.2f}s (timeout {T:g}s)"

    # containerd tears the half-made task down after the call has failed: its shim
    # and runc first, then its bundle directory (a new task needs that name free).
    bundle = slow_runc.containerd.state / "io.containerd.runtime.v2.task"
    bundle = bundle / slow_runc.containerd.namespace / container_id
    wait_for(
        lambda: not _processes_naming(container_id) and not bundle.exists(),
        timeout=2 * T + SLACK,
        what=f"no shim, runc or bundle left for {container_id} after {raised.value}",
    )
    assert runtime.get_task(container_id, timeout=5) is None
    assert container_id not in {t.container_id for t in runtime.list_tasks(timeout=5)}

    slow_runc.clear()
    task = runtime.start_task(container_id, stdio=f"file://{tmp_path / 'task.log'}", timeout=10)
    assert task.state == TaskState.RUNNING and task.pid > 0, task
    print(f"start_task timed out after {elapsed:.2f}s with a timeout of {T:g}s")
