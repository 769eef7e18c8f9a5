"""A burst of execs in one container, against the real containerd (1.6, which takes
an exec's Start one at a time per container): each start has its own deadline once
its turn comes, so every exec of the burst runs instead of timing out in the queue.
Found by bench/streams.py: 34 of 50 execs at once failed with 'no answer from
containerd' on a 5 s deadline."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.containerd.execs import open_execs
from sandlot.adapters.runtime import ContainerSpec
from tests.support.containerd import PrivateContainerd, scratch_spec

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

BURST = 40
CALL_TIMEOUT = 2.0  # one start's deadline; the burst as a whole takes longer than that


def test_every_exec_of_a_burst_in_one_container_runs(
    containerd: PrivateContainerd,
    runtime: ContainerdRuntime,
    busybox_image: str,
    tmp_path: Path,
) -> None:
    container_id = f"burst-{uuid.uuid4().hex[:8]}"
    spec = scratch_spec(["sleep", "1000"], container_id, host_network=False)
    runtime.create_container(
        ContainerSpec(id=container_id, image=busybox_image, oci_spec=spec), timeout=10
    )
    runtime.start_task(container_id, stdio=f"file://{tmp_path / 'task.log'}", timeout=10)
    execs = open_execs(containerd.address, containerd.namespace, str(tmp_path / "fifos"))

    def run(i: int) -> str:
        exec_id = f"e{i}-{uuid.uuid4().hex[:6]}"
        try:
            process = execs.start(
                container_id, exec_id, ["true"], tty=False, stdin=False, timeout=CALL_TIMEOUT
            )
        except Exception as e:
            return f"start failed: {e}"
        try:
            code = execs.wait(process, timeout=60)
            return "ok" if code == 0 else f"exit {code}"
        finally:
            execs.delete(container_id, exec_id, timeout=CALL_TIMEOUT * 5)
            process.release()

    try:
        with ThreadPoolExecutor(BURST) as pool:
            outcomes = list(pool.map(run, range(BURST)))
    finally:
        execs.close()
        runtime.kill_task(container_id, 9, timeout=5)
        runtime.wait_task(container_id, timeout=10)
        runtime.delete_task(container_id, timeout=5)
        runtime.delete_container(container_id, timeout=5)
        runtime.remove_snapshot(container_id, timeout=5)
    failed = [o for o in outcomes if o != "ok"]
    assert not failed, f"{len(failed)} of {BURST} execs failed; first: {failed[0]}"
