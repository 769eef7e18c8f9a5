"""A sandbox's output reaches its log through the agent, against the real API
server and containerd: the size cap holds as the bytes are written, and output
written while no agent runs waits for the next one instead of being lost.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/logs-busybox:test"
OUTAGE = 2.0  # seconds the node runs without an agent: the fault itself, not a wait


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


@pytest.fixture
def fleet(
    containerd: PrivateContainerd, archive: Path, tmp_path: Path
) -> Iterator[agents.AgentFleet]:
    with (
        agents.containerd_namespace(containerd, "lg", archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs", log_interval="0.2s") as f,
    ):
        yield f


def _run(kube: client.ApiClient, namespace: str, node: str, script: str) -> str:
    name = f"out-{uuid.uuid4().hex[:6]}"
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": IMAGE, "command": ["sh", "-c", script], "nodeName": node},
    }
    created: Any = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", body
    )

    def running() -> bool:
        sb: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", name
        )
        phase = (sb.get("status") or {}).get("phase")
        assert phase not in ("Failed", "Dead", "Succeeded"), sb.get("status")
        return phase == "Running"

    wait_for(running, timeout=60, what=f"sandbox {name} to run")
    return str(created["metadata"]["uid"])


def _log(directory: Path, uid: str) -> Path:
    return wait_for(
        lambda: next(directory.glob(f"*_{uid}.log"), None),
        timeout=20,
        what=f"the log of {uid} in {directory}",
    )


def test_a_burst_past_the_cap_leaves_no_file_over_it(
    kube: client.ApiClient, namespace: str, fleet: agents.AgentFleet
) -> None:
    """1 MiB and 100 bytes without a newline in one burst, against a 64 KiB cap: the
    previous generation is exactly the cap, the current file the remainder. A size
    check run after the writes (the old periodic rotation) finds the whole burst in
    one file instead."""
    cap = 64 * 1024
    node = f"node-{uuid.uuid4().hex[:8]}"
    fleet.start(kube, namespace, node, log_max_bytes=cap)
    total = 1024 * 1024 + 100
    uid = _run(kube, namespace, node, f"head -c {total} /dev/zero | tr '\\0' x; sleep 600")
    current = _log(fleet.log_dir, uid)
    rotated = current.with_name(current.name + ".1")
    wait_for(
        lambda: rotated.exists() and current.stat().st_size == total % cap,
        timeout=30,
        what=f"the burst written: {total % cap} bytes after the last rotation",
    )
    assert rotated.stat().st_size == cap
    assert rotated.read_bytes() + current.read_bytes() == b"x" * (cap + total % cap)


def test_output_written_while_the_agent_is_down_reaches_the_log_whole(
    kube: client.ApiClient, namespace: str, fleet: agents.AgentFleet
) -> None:
    """A counter printed every 20 ms; the agent stops for OUTAGE seconds and a new
    one starts on the node. The log holds every number once, in order: nothing was
    lost while no agent read, and the task was re-adopted, not restarted (it would
    count from 0 again)."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    first = fleet.start(kube, namespace, node)
    script = "i=0; while true; do echo $i; i=$((i+1)); busybox usleep 20000; done"
    uid = _run(kube, namespace, node, script)
    log = _log(fleet.log_dir, uid)

    def numbers() -> list[int]:
        return [int(line) for line in log.read_text().split("\n")[:-1]]

    wait_for(lambda: len(numbers()) > 20, timeout=20, what="20 lines before the outage")
    first.shutdown()
    before = len(numbers())
    time.sleep(OUTAGE)
    assert len(numbers()) - before <= 1, "the log grew while no agent ran"
    fleet.start(kube, namespace, node)
    target = before + int(OUTAGE / 0.02) + 20
    wait_for(
        lambda: len(numbers()) > target,
        timeout=30,
        what=f"{target} lines after the new agent took the output back",
    )
    seen = numbers()
    assert seen == list(range(len(seen))), "a gap or a restart in the counter"
