"""Writers held at their limits by the filesystem as they write, against the real
API server and containerd: containerd's root, state and the sandboxes' logs on a
small loop-mounted btrfs with quotas on (1 GiB), watermarks 50% / 40%; two
sandboxes limited to 128 MiB (one by its own limit, one by the node's default)
writing as fast as they can. Each writer's ``dd`` meets EDQUOT at its cap, the
agent ends it Failed/EphemeralStorageExceeded, and the disk, sampled every 50 ms,
never reaches the high watermark; a third whose limit does not fit in the room
below it (512 MiB, 256 taken) is refused, OverCapacity. On ext4 without the cap
the same writers overshoot their limits between two measurements."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.api.reasons import SandboxReason
from sandlot.policy.ephemeralstorage import write_cap
from tests.integration.test_agent_disk_pressure import Peak, _status, _used_fraction
from tests.support import agents
from tests.support.loopdisk import loop_disk
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/cap-busybox:test"
SIZE = 2**30
HIGH, LOW = 50.0, 40.0
LIMIT = 128 * 2**20
DEADLINE = 300.0
WRITE_FOREVER = ["sh", "-c", "busybox dd if=/dev/zero of=/big bs=1M 2>&1; sleep 3600"]


def _btrfs_available() -> str | None:
    if "btrfs" not in Path("/proc/filesystems").read_text():
        return "this kernel has no btrfs"
    return None


@contextlib.contextmanager
def quota_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 GiB btrfs with quotas enabled, loop-mounted."""
    with loop_disk(tmp_path, SIZE, ["mkfs.btrfs", "-q", "-f"], "wc-") as mount:
        subprocess.run(["btrfs", "quota", "enable", str(mount)], check=True, timeout=60)
        yield mount


def test_writers_meet_their_cap_as_they_write_and_the_disk_stays_under_high(
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    reason = _btrfs_available()
    if reason is not None:
        pytest.skip(reason)
    archive = agents.busybox_archive(tmp_path_factory, IMAGE)
    with contextlib.ExitStack() as stack:
        node = f"node-wc-{os.getpid()}"
        mount, agent = agents.agent_on_disk(
            stack, kube, namespace, quota_disk(tmp_path), archive, "wc", node,
            gc_high=HIGH, gc_low=LOW, log_interval="0.5s",
            default_ephemeral_storage_limit="128Mi",
        )  # fmt: skip
        before = _used_fraction(mount)
        peak = Peak(mount)
        stack.callback(peak.close)
        own = {"resources": {"limits": {"ephemeralStorage": "128Mi"}}}
        for name, limits in (("writer-a", own), ("writer-b", {})):  # b: the node's default
            spec = {"image": IMAGE, "command": WRITE_FOREVER, **limits}
            agents.schedule_sandbox(kube, namespace, name, node, spec)
        wait_for(
            lambda: all(
                _status(kube, namespace, n).get("phase") in ("Running", "Failed")
                for n in ("writer-a", "writer-b")
            ),
            timeout=60,
            what="both writers started",
        )
        too_big = {"resources": {"limits": {"ephemeralStorage": "300Mi"}}}
        spec = {"image": IMAGE, "command": WRITE_FOREVER, **too_big}
        agents.schedule_sandbox(kube, namespace, "writer-c", node, spec)
        refused = wait_for(
            lambda: (s := _status(kube, namespace, "writer-c")).get("phase") == "Failed" and s,
            timeout=60,
            what="writer-c refused: its limit does not fit below the high watermark",
        )
        assert refused["reason"] == SandboxReason.OVER_CAPACITY, refused
        assert (
            "ephemeral-storage limit 0.29Gi does not fit: 0.25Gi of 0.50Gi" in (refused["message"])
        ), refused
        for name in ("writer-a", "writer-b"):
            status = wait_for(
                partial(
                    lambda n: (s := _status(kube, namespace, n)).get("phase") == "Failed" and s,
                    name,
                ),
                timeout=DEADLINE,
                what=f"{name} to end Failed past its ephemeral-storage limit",
            )
            assert status["reason"] == SandboxReason.EPHEMERAL_STORAGE_EXCEEDED, status
            # What the measurement that stopped it found: never past the cap.
            found = re.search(r"\((\d+) bytes, writable layer and logs\)", status["message"])
            assert found, status["message"]
            used = int(found.group(1))
            print(f"{name}: stopped holding {used / 2**20:.1f} MiB (limit 128 MiB)")
            assert LIMIT < used <= write_cap(LIMIT) + 2**20, status["message"]
        peak.close()
        assert agent.parts.work.starts.write_caps.capped == 2, "a writer's layer was not capped"
        grown = (peak.peak - before) * SIZE
        print(
            f"disk before {before:.1%}, peak {peak.peak:.1%} (+{grown / 2**20:.0f} MiB; "
            f"two caps of {write_cap(LIMIT) / 2**20:.0f} MiB), high {HIGH}%"
        )
        assert peak.peak < HIGH / 100, f"the disk reached {peak.peak:.1%}"
        # Each writer held at its cap: the disk grew by at most the two caps (and metadata).
        assert grown < 2 * write_cap(LIMIT) + 64 * 2**20, f"the disk grew {grown / 2**20:.0f} MiB"
