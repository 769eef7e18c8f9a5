"""Sandbox isolation, claimed against the real things.

- The API server: the admission policy (``sandlot.api.admission``) installed as a
  real ValidatingAdmissionPolicy refuses what a namespace's level forbids, with
  the message users see, and agrees with the agent's Python check case by case.
- containerd + runc: a container built from ``build_oci_spec`` cannot mount,
  load a module, enter new namespaces, see the host's processes or exceed its
  capability baseline, its pids limit or (with the agent) its memory limit.

Commands run inside with the image's static busybox; each container's output
goes to a log file read after its exit.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.nodeguard import bounding_capabilities
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.main import Agent
from sandlot.agent.teardown import teardown_many
from sandlot.api.admission import POLICY_NAME, Level, admission_policy
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import LEVEL_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.ocispec import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    ImageConfig,
    build_oci_spec,
    capability_mask,
    cgroups_path_for,
)
from sandlot.policy.podsecurity import check
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration]

EPERM_TEXT = "Operation not permitted"
EXIT_MARK = "__exit="
NODE_CAPABILITIES = bounding_capabilities(ALL_CAPABILITIES)


def _sandbox(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "docker.io/sandlot/busybox:test", **spec},
    }


# ------------------------------------------------------------------ admission (API server)


def _label_namespace(kube: client.ApiClient, namespace: str, level: str | None) -> None:
    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"labels": {LEVEL_LABEL: level}}}
    )


def _create(kube: client.ApiClient, namespace: str, body: dict[str, Any], *, dry_run: bool) -> str:
    """None-or-refusal: '' when admitted, else the API server's message."""
    try:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", body, dry_run="All" if dry_run else None
        )
    except client.ApiException as exc:
        if exc.status in (400, 403, 422):
            return str(json.loads(exc.body)["message"])
        raise
    return ""


def _wait_admission(
    kube: client.ApiClient, namespace: str, body: dict[str, Any], *, admitted: bool
) -> None:
    """Namespace labels reach the policy through the API server's informer: wait
    (bounded) until a dry run of ``body`` gets the expected answer."""
    wait_for(
        lambda: (_create(kube, namespace, body, dry_run=True) == "") == admitted,
        timeout=10,
        interval=0.2,
        what=f"the admission policy to {'admit' if admitted else 'refuse'} {body['metadata']['name']}",
    )


def _remove_policy(kube: client.ApiClient) -> None:
    adm = client.AdmissionregistrationV1Api(kube)
    with contextlib.suppress(client.ApiException):
        adm.delete_validating_admission_policy_binding(POLICY_NAME)
    with contextlib.suppress(client.ApiException):
        adm.delete_validating_admission_policy(POLICY_NAME)


@pytest.fixture
def no_admission_policy(kube: client.ApiClient, namespace: str) -> None:
    """No admission policy (a chart test on this control plane may have installed
    it): confirmed by a dry-run privileged Sandbox being admitted."""
    _remove_policy(kube)
    probe = _sandbox(f"probe-{uuid.uuid4().hex[:6]}", securityContext={"privileged": True})
    _wait_admission(kube, namespace, probe, admitted=True)


@pytest.fixture
def admission(kube: client.ApiClient, namespace: str) -> Iterator[None]:
    """The policy and binding installed; gone (and seen gone) after the test.

    Policies take effect asynchronously, so both directions are confirmed with
    a bounded poll: a dry-run privileged Sandbox in an unlabelled namespace is
    refused once the policy works, admitted again once it is removed (other
    tests on this control plane create hostNetwork sandboxes).
    """
    adm = client.AdmissionregistrationV1Api(kube)
    policy, binding = admission_policy()
    probe = _sandbox(f"probe-{uuid.uuid4().hex[:6]}", securityContext={"privileged": True})
    _remove_policy(kube)  # a chart test on this control plane may have installed it
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    try:
        wait_for(
            lambda: _create(kube, namespace, probe, dry_run=True),
            timeout=30,
            what="the admission policy to take effect",
            interval=0.2,
        )
        yield
    finally:
        with contextlib.suppress(client.ApiException):
            adm.delete_validating_admission_policy_binding(POLICY_NAME)
        with contextlib.suppress(client.ApiException):
            adm.delete_validating_admission_policy(POLICY_NAME)
        wait_for(
            lambda: _create(kube, namespace, probe, dry_run=True) == "",
            timeout=30,
            what="the admission policy to be gone",
            interval=0.2,
        )


@pytest.mark.xdist_group("admission-policy")
def test_privileged_sandbox_is_refused_in_a_default_namespace_with_the_label_to_use(
    kube: client.ApiClient, namespace: str, admission: None
) -> None:
    message = _create(
        kube, namespace, _sandbox("root", securityContext={"privileged": True}), dry_run=False
    )
    assert "spec.securityContext.privileged is not allowed" in message
    assert f"namespace {namespace} (level baseline)" in message
    assert f"label the namespace {LEVEL_LABEL}=privileged to allow it" in message


@pytest.mark.xdist_group("admission-policy")
def test_privileged_sandbox_is_admitted_in_a_namespace_labelled_privileged(
    kube: client.ApiClient, namespace: str, admission: None
) -> None:
    _label_namespace(kube, namespace, "privileged")
    body = _sandbox("root", hostNetwork=True, securityContext={"privileged": True})
    _wait_admission(kube, namespace, body, admitted=True)
    assert _create(kube, namespace, body, dry_run=False) == ""
    stored = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "root"
    )
    assert stored["spec"]["securityContext"]["privileged"] is True


@pytest.mark.xdist_group("admission-policy")
def test_an_update_that_leaves_the_spec_alone_passes_after_the_level_was_lowered(
    kube: client.ApiClient, namespace: str, admission: None
) -> None:
    _label_namespace(kube, namespace, "privileged")
    _wait_admission(kube, namespace, _sandbox("probe", hostNetwork=True), admitted=True)
    assert _create(kube, namespace, _sandbox("hn", hostNetwork=True), dry_run=False) == ""
    _label_namespace(kube, namespace, None)
    _wait_admission(kube, namespace, _sandbox("probe", hostNetwork=True), admitted=False)
    api = client.CustomObjectsApi(kube)
    api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "hn", {"metadata": {"labels": {"a": "b"}}}
    )
    with pytest.raises(client.ApiException) as refused:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", "hn", {"spec": {"command": ["true"]}}
        )
    assert "spec.hostNetwork is not allowed" in json.loads(refused.value.body)["message"]


# (level label, spec) pairs: the API server and the agent's check must agree on each.
AGREEMENT_CASES = [
    (None, {}),
    (None, {"hostNetwork": True}),
    (None, {"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}),
    (None, {"securityContext": {"capabilities": {"add": ["CAP_chown", "MKNOD"]}}}),
    (None, {"securityContext": {"capabilities": {"add": ["NET_RAW"]}}}),
    (None, {"securityContext": {"runAsUser": 0, "readOnlyRootFilesystem": True}}),
    ("baseline", {"securityContext": {"privileged": True}}),
    ("privileged", {"hostNetwork": True, "securityContext": {"capabilities": {"add": ["ALL"]}}}),
    ("restricted", {}),
    ("restricted", {"securityContext": {"runAsNonRoot": True}}),
    ("restricted", {"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}),
    ("restricted", {"securityContext": {"runAsNonRoot": True, "capabilities": {"add": ["KILL"]}}}),
    (
        "restricted",
        {"securityContext": {"runAsNonRoot": True, "capabilities": {"add": ["NET_BIND_SERVICE"]}}},
    ),
    ("no-such-level", {}),
    ("no-such-level", {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}),
]


@pytest.mark.xdist_group("admission-policy")
def test_api_server_and_agent_check_agree_on_every_level(
    kube: client.ApiClient, namespace: str, admission: None
) -> None:
    from sandlot.api.admission import level_of

    disagreements = []
    for label, spec in AGREEMENT_CASES:
        _label_namespace(kube, namespace, label)
        # Namespace labels reach the policy through an informer: wait until it sees them.
        level = level_of({LEVEL_LABEL: label} if label else {})
        body = _sandbox(f"c-{uuid.uuid4().hex[:6]}", **spec)
        violations = check(SandboxSpec.model_validate(body["spec"]), level, namespace)

        def settled(
            body: dict[str, Any] = body, level: Level = level, expect: bool = not violations
        ) -> str | None:
            message = _create(kube, namespace, body, dry_run=True)
            if (message == "") == expect and (expect or f"(level {level.value})" in message):
                return message or "admitted"
            return None

        try:
            outcome = wait_for(settled, timeout=10, what=f"{label}: {spec}", interval=0.2)
        except AssertionError:
            disagreements.append((label, spec, [v.message for v in violations]))
            continue
        if violations:
            # The rule the API server reports is one the agent reports too, word for word.
            assert any(v.message in outcome for v in violations), (outcome, violations)
    assert not disagreements, disagreements


# ------------------------------------------------------------------ containerd: inside a sandbox

RunResult = tuple[int, str]
Run = Callable[..., RunResult]


@pytest.fixture
def run_sandbox(runtime: ContainerdRuntime, busybox_image: str, tmp_path: Path) -> Iterator[Run]:
    """``run(script, **spec) -> (exit code, output)``: one container per call, spec
    built by the agent's own ``build_oci_spec``; torn down after the test."""
    started: list[str] = []

    def run(script: str, *, pids_limit: int | None = 1024, **spec: Any) -> RunResult:
        container_id = f"iso-{uuid.uuid4().hex[:10]}"
        started.append(container_id)
        # The shim copies output to the log asynchronously, so the task's exit can
        # come before the last line: the script ends by printing its status, and
        # the log is read once that line is there.
        # stderr joins stdout inside the sandbox: two pipes would reach the log in
        # no particular order.
        command = ["sh", "-c", f'{{ {script}\n}} 2>&1\necho "{EXIT_MARK}$?"']
        sandbox = SandboxSpec.model_validate({"image": busybox_image, "command": command, **spec})
        oci = build_oci_spec(
            container_id,
            sandbox,
            ImageConfig(),
            hostname=container_id,
            pids_limit=pids_limit,
            node_capabilities=NODE_CAPABILITIES,
        )
        runtime.create_container(
            ContainerSpec(id=container_id, image=busybox_image, oci_spec=oci), timeout=10
        )
        log = tmp_path / f"{container_id}.log"
        runtime.start_task(container_id, log_path=str(log), timeout=10)
        runtime.wait_task(container_id, timeout=30)
        text = wait_for(
            lambda: log.exists() and EXIT_MARK in log.read_text() and log.read_text(),
            timeout=10,
            what=f"the output of {container_id}",
        )
        output, _, code = text.rpartition(EXIT_MARK)
        return int(code.strip()), output

    yield run
    teardown_many(runtime, started, kill_wait=3, call_timeout=5, concurrency=4)


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
        runtime.start_task(container_id, log_path="", timeout=10)
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


# ------------------------------------------------------------------ the agent: OOM and policy

AGENT_IMAGE = "docker.io/sandlot/isolation-busybox:test"


@pytest.fixture(scope="module")
def agent_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, AGENT_IMAGE)


@pytest.fixture
def agent(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    agent_archive: Path,
    tmp_path: Path,
) -> Iterator[Agent]:
    """A started agent on its own node name and containerd namespace."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    with (
        agents.containerd_namespace(containerd, "iso", agent_archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs") as fleet,
    ):
        yield fleet.start(
            kube, namespace, node, call_timeout="3s", stop_grace="1s", reap_interval="0.5s"
        )
    agents.delete_node(kube, node)


def _schedule(kube: client.ApiClient, namespace: str, name: str, node: str, **spec: Any) -> None:
    api = client.CustomObjectsApi(kube)
    body = _sandbox(name, nodeName=node, **spec)
    body["spec"]["image"] = AGENT_IMAGE
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", body)
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", name, {"status": {"phase": "Scheduled"}}
    )


def _wait_status(
    kube: client.ApiClient, namespace: str, name: str, phases: set[str], timeout: float = 30
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", name
        )
        status = dict(sb.get("status") or {})
        return status if status.get("phase") in phases else None

    return wait_for(probe, timeout=timeout, what=f"sandbox {name} to reach {sorted(phases)}")


@pytest.mark.containerd
def test_process_over_its_memory_limit_is_killed_and_the_sandbox_stops_oom_killed(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    # awk doubles a string until the kernel stops it: 32 MiB are reached in 25 steps.
    _schedule(
        kube,
        namespace,
        "hog",
        agent.node,
        command=["busybox", "awk", 'BEGIN { s = "x"; while (1) s = s s }'],
        resources={"limits": {"memory": "32Mi"}},
    )
    status = _wait_status(kube, namespace, "hog", {"Stopped", "Failed"})
    assert status["phase"] == "Stopped", status
    assert status["reason"] == "OOMKilled", status
    assert status["exitCode"] == 137, status
    assert "memory limit" in status["message"]


@pytest.mark.containerd
def test_agent_refuses_a_privileged_sandbox_the_admission_policy_never_saw(
    kube: client.ApiClient, namespace: str, no_admission_policy: None, agent: Agent
) -> None:
    # No admission policy is installed here: the agent is the last line.
    _schedule(kube, namespace, "sneaky", agent.node, securityContext={"privileged": True})
    status = _wait_status(kube, namespace, "sneaky", {"Failed", "Running"})
    assert status["phase"] == "Failed", status
    assert status["reason"] == "PolicyViolation"
    assert "spec.securityContext.privileged is not allowed" in status["message"]
    assert f"{LEVEL_LABEL}=privileged" in status["message"]


@pytest.mark.containerd
def test_agent_runs_a_privileged_sandbox_in_a_namespace_labelled_privileged(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    _label_namespace(kube, namespace, "privileged")
    _schedule(
        kube,
        namespace,
        "root",
        agent.node,
        command=["sleep", "30"],
        securityContext={"privileged": True},
    )
    status = _wait_status(kube, namespace, "root", {"Failed", "Running"})
    assert status["phase"] == "Running", status


@pytest.mark.containerd
def test_agent_refuses_run_as_non_root_when_the_process_would_be_root(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    _schedule(kube, namespace, "rooty", agent.node, securityContext={"runAsNonRoot": True})
    status = _wait_status(kube, namespace, "rooty", {"Failed", "Running"})
    assert status["phase"] == "Failed", status
    assert status["reason"] == "RunAsRootRefused"
    assert "runAsNonRoot" in status["message"] and "UID 0" in status["message"]


# ------------------------------------------------------------------ the chart renders the same policy


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_chart_template_renders_the_policy_the_tests_install(level: str) -> None:
    import subprocess

    import yaml

    from sandlot.devtools.controlplane import helm_path
    from tests.support.kube import repo_root

    proc = subprocess.run(
        [
            str(helm_path()),
            "template",
            "sl",
            str(repo_root() / "charts" / "sandlot"),
            "--show-only",
            "templates/admission-policy.yaml",
            "--set",
            f"admissionPolicy.defaultLevel={level}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rendered = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    assert rendered == admission_policy(level)
