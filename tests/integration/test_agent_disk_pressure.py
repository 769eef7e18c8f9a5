"""The node's disk kept under its high watermark, against the real API server and
containerd: containerd's root, state and the sandboxes' logs on a small
loop-mounted ext4 filesystem (1 GiB, no journal), watermarks 50% / 40%; two
sandboxes writing without end and a quiet one. The writers end Failed/Evicted,
the message naming the resource and both usages; the quiet one keeps running; the
disk goes back under the high watermark.

What the agent guarantees is asserted, not a peak: between two passes a writer
keeps writing while another's teardown runs on the same disk, so the disk can go
past the high watermark for a while (the peak seen is printed)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from tests.support import agents
from tests.support.loopdisk import loop_disk
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/disk-busybox:test"
SIZE = 2**30
HIGH, LOW = 50.0, 40.0
DEADLINE = 300.0  # seconds: writes, evictions and collections on a busy machine
# Writes without end: a full disk only pauses it. A writer that stopped at the
# first ENOSPC would, once the other is evicted and its layer removed, sit under
# the high watermark for good, and rightly never be evicted.
WRITE_FOREVER = [
    "sh",
    "-c",
    "i=0; while :; do busybox dd if=/dev/zero of=/big$i bs=1M 2>/dev/null;"
    " i=$((i+1)); sleep 0.5; done",
]


def _used_fraction(path: Path) -> float:
    st = os.statvfs(path)
    return 1 - st.f_bavail / st.f_blocks


def small_disk(tmp_path: Path) -> contextlib.AbstractContextManager[Path]:
    """A 1 GiB ext4 filesystem without journal, loop-mounted."""
    mkfs = ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0"]
    return loop_disk(tmp_path, SIZE, mkfs, "dp-")


class Peak:
    """The fullest the disk was seen, sampled on a thread until stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.peak = path, 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, _used_fraction(self.path))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _node_disk(kube: client.ApiClient, node: str) -> dict[str, Any]:
    body: Any = client.CustomObjectsApi(kube).get_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", node
    )
    return dict((body.get("status") or {}).get("disk") or {})


def _status(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    sb: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )
    return dict(sb.get("status") or {})


def test_writers_are_evicted_and_the_disk_goes_back_under_its_high_watermark(
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    archive = agents.busybox_archive(tmp_path_factory, IMAGE)
    with contextlib.ExitStack() as stack:
        node = f"node-dp-{os.getpid()}"
        mount, _ = agents.agent_on_disk(
            stack, kube, namespace, small_disk(tmp_path), archive, "dp", node,
            gc_high=HIGH, gc_low=LOW, log_interval="0.5s",
        )  # fmt: skip
        peak = Peak(mount)
        stack.callback(peak.close)
        before = _used_fraction(mount)
        agents.schedule_sandbox(
            kube, namespace, "quiet", node, {"image": IMAGE, "command": ["sleep", "3600"]}
        )
        wait_for(
            lambda: _status(kube, namespace, "quiet").get("phase") == "Running",
            timeout=DEADLINE,
            what="the quiet sandbox Running",
        )
        for name in ("writer-a", "writer-b"):
            agents.schedule_sandbox(
                kube, namespace, name, node, {"image": IMAGE, "command": WRITE_FOREVER}
            )
        for name in ("writer-a", "writer-b"):
            status = wait_for(
                partial(
                    lambda n: (s := _status(kube, namespace, n)).get("phase") == "Failed" and s,
                    name,
                ),
                timeout=DEADLINE,
                what=f"{name} to be evicted (Failed) for the node's disk",
            )
            assert status["reason"] == "Evicted", status
            message = status["message"]
            assert "ephemeral-storage" in message and "this sandbox used" in message, message
            assert "high watermark 50%" in message, message
        wait_for(
            lambda: _used_fraction(mount) < HIGH / 100,
            timeout=DEADLINE,
            what=f"the disk back under {HIGH}% (now {_used_fraction(mount):.1%})",
        )
        quiet = _status(kube, namespace, "quiet")
        assert quiet["phase"] == "Running", quiet
        print(
            f"disk before {before:.1%}, peak {peak.peak:.1%}, "
            f"after {_used_fraction(mount):.1%} (high {HIGH}%, low {LOW}%)"
        )


def test_a_sandbox_placed_by_hand_waits_while_the_disk_is_under_pressure(
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    archive = agents.busybox_archive(tmp_path_factory, IMAGE)
    with contextlib.ExitStack() as stack:
        node = f"node-dph-{os.getpid()}"
        mount, agent = agents.agent_on_disk(
            stack,
            kube,
            namespace,
            small_disk(tmp_path),
            archive,
            "dp",
            node,
            gc_high=HIGH,
            gc_low=LOW,
            log_interval="0.5s",
            disk_pressure_transition="5s",
            # pinned: image GC, which runs first under pressure, must keep it (nothing
            # here could pull it again)
            agent_image=IMAGE,
        )
        # Not a sandbox's: no eviction can free it, so the pressure holds.
        ballast = mount / "ballast"
        subprocess.run(
            ["fallocate", "-l", str(SIZE * 6 // 10), str(ballast)], check=True, timeout=60
        )
        wait_for(
            lambda: agent.parts.pressure.refusal(),
            timeout=DEADLINE,
            what="the agent to see its disk under pressure",
        )
        disk = wait_for(
            lambda: (d := _node_disk(kube, node)).get("pressure") is True and d,
            timeout=DEADLINE,
            what="the SandboxNode's status.disk to say pressure",
        )
        assert disk["since"] and disk["usagePercent"] >= HIGH, disk
        assert "under disk pressure" in disk["message"], disk
        agents.schedule_sandbox(
            kube, namespace, "late", node, {"image": IMAGE, "command": ["sleep", "3600"]}
        )

        def held_back() -> dict[str, Any]:
            status = _status(kube, namespace, "late")
            assert status.get("reason") == "DiskPressure", status
            return status

        held = wait_for(
            held_back,
            timeout=DEADLINE,
            what="the hand-placed sandbox held with reason DiskPressure",
        )
        assert held["phase"] == "Scheduled", held
        assert "under disk pressure" in held["message"], held
        assert "high watermark 50%" in held["message"], held
        ballast.unlink()
        running = wait_for(
            lambda: (s := _status(kube, namespace, "late")).get("phase") == "Running" and s,
            timeout=DEADLINE,
            what="the held sandbox Running once the pressure cleared",
        )
        assert running["phase"] == "Running"
        cleared = wait_for(
            lambda: (d := _node_disk(kube, node)).get("pressure") is False and d,
            timeout=DEADLINE,
            what="the SandboxNode's status.disk to say the pressure is over",
        )
        assert cleared.get("since") is None, cleared
