"""Sandbox isolation inside the container, claimed against containerd + runc: a
container built from ``build_oci_spec`` cannot mount, load a module, enter new
namespaces, see the host's processes or exceed its capability baseline or its
pids limit, and its limits reach its cgroup.

Commands run inside with the image's static busybox; each container's output
goes to a log file read after its exit.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.teardown import teardown_many
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.ocispec import (
    DEFAULT_CAPABILITIES,
    ImageConfig,
    build_oci_spec,
    capability_mask,
    cgroups_path_for,
)
from tests.support.containerd_fixtures import EVERY_CONTAINERD, NODE_CAPABILITIES, ScriptRuns

pytestmark = [pytest.mark.integration]

EPERM_TEXT = "Operation not permitted"


RunResult = tuple[int, str]
Run = Callable[..., RunResult]


@pytest.fixture
def run_sandbox(script_runs: ScriptRuns, busybox_image: str) -> Run:
    """``run(script, **spec) -> (exit code, output)``: one container per call, spec
    built by the agent's own ``build_oci_spec``; torn down after the test."""

    def run(script: str, *, pids_limit: int = 1024, **spec: Any) -> RunResult:
        return script_runs.run(
            busybox_image, script, config=ImageConfig(), pids_limit=pids_limit, **spec
        )

    return run


def _status_field(output: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(\S+)", output, re.MULTILINE)
    assert match, f"no {name} in:\n{output}"
    return match.group(1)


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_mount_fails_even_with_sys_admin_added(run_sandbox: Run) -> None:
    for spec in ({}, {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}):
        code, out = run_sandbox("mkdir -p /tmp/m && busybox mount -t tmpfs none /tmp/m", **spec)
        assert code != 0, f"mount succeeded with {spec}: {out}"
        # busybox's words for EPERM from mount(2)
        assert "mount: permission denied" in out, out


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_loading_a_kernel_module_fails_even_with_sys_module_added(run_sandbox: Run) -> None:
    for spec in ({}, {"securityContext": {"capabilities": {"add": ["SYS_MODULE"]}}}):
        code, out = run_sandbox("echo junk > /tmp/x.ko; busybox insmod /tmp/x.ko", **spec)
        assert code != 0, f"insmod succeeded with {spec}: {out}"
        assert "can't insert" in out and EPERM_TEXT in out, out


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_new_user_namespace_is_refused(run_sandbox: Run) -> None:
    code, out = run_sandbox("busybox unshare -U -r id -u")
    assert code != 0, out
    assert EPERM_TEXT in out, out


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_host_processes_are_not_visible(run_sandbox: Run) -> None:
    code, out = run_sandbox("ps -o pid,comm")
    assert code == 0, out
    pids = [int(line.split()[0]) for line in out.splitlines()[1:]]
    # PID 1 is the sandbox's shell, ps its only other process; the node has hundreds.
    assert sorted(pids)[0] == 1 and len(pids) <= 2, out


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_capabilities_are_the_baseline_with_no_new_privileges_and_seccomp(
    run_sandbox: Run,
) -> None:
    code, out = run_sandbox("cat /proc/self/status")
    assert code == 0, out
    baseline = capability_mask(DEFAULT_CAPABILITIES)
    for name in ("CapEff", "CapPrm", "CapBnd"):
        assert int(_status_field(out, name), 16) == baseline, f"{name}: {out}"
    assert int(_status_field(out, "CapInh"), 16) == 0
    assert _status_field(out, "NoNewPrivs") == "1"
    assert _status_field(out, "Seccomp") == "2"  # filter mode


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_added_capability_joins_the_baseline(run_sandbox: Run) -> None:
    code, out = run_sandbox(
        "cat /proc/self/status", securityContext={"capabilities": {"add": ["net_raw"]}}
    )
    assert code == 0, out
    expected = capability_mask([*DEFAULT_CAPABILITIES, "CAP_NET_RAW"])
    assert int(_status_field(out, "CapEff"), 16) == expected


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_privileged_sandbox_gets_every_capability_and_no_seccomp(run_sandbox: Run) -> None:
    code, out = run_sandbox("cat /proc/self/status", securityContext={"privileged": True})
    assert code == 0, out
    assert int(_status_field(out, "CapEff"), 16) == capability_mask(NODE_CAPABILITIES)
    assert _status_field(out, "Seccomp") == "0"


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_non_root_user_has_no_effective_capabilities(run_sandbox: Run) -> None:
    code, out = run_sandbox(
        "id -u; id -g; cat /proc/self/status",
        securityContext={"runAsUser": 1000, "runAsGroup": 1001, "runAsNonRoot": True},
    )
    assert code == 0, out
    assert out.split()[:2] == ["1000", "1001"]
    assert int(_status_field(out, "CapEff"), 16) == 0


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_read_only_root_refuses_writes_when_asked_for(run_sandbox: Run) -> None:
    code, out = run_sandbox("touch /written", securityContext={"readOnlyRootFilesystem": True})
    assert code != 0 and "Read-only file system" in out, out
    code, out = run_sandbox("touch /written")
    assert code == 0, out


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_kernel_paths_are_masked_or_read_only(run_sandbox: Run) -> None:
    # Masked files read as empty (a /dev/null bind); on the node they are not.
    masked = [p for p in ("/proc/timer_list", "/proc/keys") if Path(p).exists()]
    assert masked, "no masked /proc file exists on this kernel to compare"
    code, out = run_sandbox(
        " ".join(f"busybox wc -c < {p};" for p in masked)
        + " echo 0 > /proc/sys/kernel/panic && echo WROTE; ls /sys/firmware | busybox wc -l"
    )
    assert code == 0, out
    lines = out.split()
    assert lines[: len(masked)] == ["0"] * len(masked), f"{masked} readable: {out}"
    assert "WROTE" not in out and "Read-only file system" in out, out
    assert lines[-1] == "0", f"/sys/firmware is not masked: {out}"


@pytest.mark.containerd
@EVERY_CONTAINERD
def test_pids_limit_stops_a_fork_bomb(run_sandbox: Run) -> None:
    code, out = run_sandbox(
        "(for i in $(busybox seq 1 30); do sleep 5 & done); echo done", pids_limit=10
    )
    assert "can't fork" in out, out
    assert code == 0 and out.rstrip().endswith("done"), "the sandbox's own shell should survive"


@pytest.mark.containerd
def test_memory_and_cpu_limits_reach_the_cgroup(
    runtime: ContainerdRuntime, busybox_image: str
) -> None:
    from sandlot.adapters.nodeguard import cgroup_v2

    container_id = f"iso-{uuid.uuid4().hex[:10]}"
    spec = SandboxSpec.model_validate(
        {
            "image": busybox_image,
            "command": ["sleep", "30"],
            "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}},
        }
    )
    oci = build_oci_spec(container_id, spec, ImageConfig(), hostname=container_id)
    runtime.create_container(
        ContainerSpec(id=container_id, image=busybox_image, oci_spec=oci), timeout=10
    )
    try:
        runtime.start_task(container_id, stdio="", timeout=10)
        root = Path("/sys/fs/cgroup")
        path = cgroups_path_for(container_id).lstrip("/")
        if cgroup_v2(root):
            assert (root / path / "memory.max").read_text().strip() == str(64 * 2**20)
            assert (root / path / "cpu.max").read_text().split() == ["25000", "100000"]
            assert (root / path / "pids.max").read_text().strip() == "1024"
        else:
            memory = (root / "memory" / path / "memory.limit_in_bytes").read_text()
            assert memory.strip() == str(64 * 2**20)
            assert (root / "cpu" / path / "cpu.cfs_quota_us").read_text().strip() == "25000"
            assert (root / "pids" / path / "pids.max").read_text().strip() == "1024"
    finally:
        teardown_many(runtime, [container_id], kill_wait=3, call_timeout=5, concurrency=1)
