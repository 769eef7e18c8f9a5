"""A tenant gets nothing beyond its sandbox, claimed against the real API server,
containerd and the kernel's cgroups:

- a sandbox that sets no limits runs with the agent's default memory, CPU and pids
  limits, or its namespace's (``sandlot.dev/default-limits``), in a cgroup under
  the configured parent;
- a sandbox whose ``spec.nodeName`` was set by hand onto a full node is refused by
  the agent (Failed, OverCapacity), never started.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.nodeguard import cgroup_v2
from sandlot.agent.main import Agent
from sandlot.agent.sandboxes import container_id_for
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import DEFAULT_LIMITS_ANNOTATION, EPHEMERAL_STORAGE_LABEL, MEMORY_LIMIT_LABEL
from sandlot.api.placement import CONTROL_PLANE_TAINT
from sandlot.api.reasons import SandboxReason
from sandlot.policy.limits import PIDS_RESERVE
from sandlot.policy.ocispec import cgroups_path_for
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/resources-busybox:test"
CGROUP = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


StartAgent = Callable[..., Agent]


@pytest.fixture
def start_agent(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    archive: Path,
    tmp_path: Path,
) -> Iterator[StartAgent]:
    """Each agent on a node and a containerd namespace of its own."""
    with contextlib.ExitStack() as stack:

        def start(node: str = "", **overrides: Any) -> Agent:
            return agents.start_agent(
                stack,
                kube,
                namespace,
                containerd,
                archive,
                tmp_path / "logs",
                "rs",
                node,
                **overrides,
            )

        yield start


def _create(kube: client.ApiClient, namespace: str, name: str, node: str, **spec: Any) -> str:
    spec = {"image": IMAGE, "command": ["sleep", "300"], **spec}
    created = agents.schedule_sandbox(kube, namespace, name, node, spec)
    return str(created["metadata"]["uid"])


def _decided(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", name
        )
        status = dict(sb.get("status") or {})
        return status if status.get("phase") in ("Running", "Failed", "Stopped") else None

    return wait_for(probe, timeout=30, what=f"sandbox {name} to run or fail")


def _cgroup_limits(path: str) -> tuple[str, str, str]:
    """(memory bytes, CPU quota per 100ms period, pids) of a container's cgroup."""
    rel = path.lstrip("/")
    if cgroup_v2(CGROUP):
        return (
            (CGROUP / rel / "memory.max").read_text().strip(),
            (CGROUP / rel / "cpu.max").read_text().split()[0],
            (CGROUP / rel / "pids.max").read_text().strip(),
        )
    return (
        (CGROUP / "memory" / rel / "memory.limit_in_bytes").read_text().strip(),
        (CGROUP / "cpu" / rel / "cpu.cfs_quota_us").read_text().strip(),
        (CGROUP / "pids" / rel / "pids.max").read_text().strip(),
    )


def test_a_sandbox_without_limits_gets_the_defaults_under_the_configured_parent(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    parent = f"/sandlot-test-{uuid.uuid4().hex[:6]}"
    agent = start_agent(
        default_memory_limit="96Mi", default_cpu_limit="300m", pids_limit=77, cgroup_parent=parent
    )
    uid = _create(kube, namespace, "plain", agent.node)
    status = _decided(kube, namespace, "plain")
    assert status["phase"] == "Running", status
    path = cgroups_path_for(container_id_for(uid), parent)
    assert _cgroup_limits(path) == (str(96 * 2**20), "30000", "77")


def test_the_parent_of_all_sandboxes_has_a_hard_memory_and_pids_limit(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    parent = f"/sandlot-test-{uuid.uuid4().hex[:6]}"
    agent = start_agent(cgroup_parent=parent, cgroup_parent_memory_reserve="1Gi")
    uid = _create(kube, namespace, "under-parent", agent.node)
    assert _decided(kube, namespace, "under-parent")["phase"] == "Running"
    memory, _, pids = _cgroup_limits(parent)
    node_memory = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]) * 1024
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    # Read back from the kernel: finite, the node's less the reserves (v1 rounds to pages).
    assert pids == str(pid_max - PIDS_RESERVE)
    assert memory != "max" and abs(int(memory) - (node_memory - 2**30)) < 4096, memory
    assert agent.parent_limits is not None
    # The sandbox's own cgroup sits under that parent, with its own limits.
    child = cgroups_path_for(container_id_for(uid), parent)
    assert _cgroup_limits(child)[2] == str(agent.settings.pids_limit)


def test_a_namespace_annotation_overrides_the_agent_defaults(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    client.CoreV1Api(kube).patch_namespace(
        namespace,
        {"metadata": {"annotations": {DEFAULT_LIMITS_ANNOTATION: "memory=48Mi,pids=33"}}},
    )
    agent = start_agent(default_memory_limit="96Mi", default_cpu_limit="300m")
    uid = _create(kube, namespace, "ns-default", agent.node)
    status = _decided(kube, namespace, "ns-default")
    assert status["phase"] == "Running", status
    path = cgroups_path_for(container_id_for(uid), agent.settings.cgroup_parent)
    assert _cgroup_limits(path) == (str(48 * 2**20), "30000", "33")


@pytest.mark.parametrize(
    ("annotation", "named"),
    [("memory=lots", "lots"), ("pids=0", "pids 0 is below the floor"), ("memory=1", "memory '1'")],
    ids=["not a quantity", "pids 0 would mean none", "memory below the floor"],
)
def test_a_bad_namespace_annotation_fails_the_start_naming_it(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent, annotation: str, named: str
) -> None:
    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"annotations": {DEFAULT_LIMITS_ANNOTATION: annotation}}}
    )
    agent = start_agent()
    _create(kube, namespace, "bad-default", agent.node)
    status = _decided(kube, namespace, "bad-default")
    assert status["phase"] == "Failed", status
    assert DEFAULT_LIMITS_ANNOTATION in status["message"] and named in status["message"], status


def test_a_hand_placed_sandbox_beyond_capacity_is_refused(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    agent = start_agent(capacity_memory="100Mi", default_memory_limit="64Mi")
    _create(kube, namespace, "first", agent.node)
    assert _decided(kube, namespace, "first")["phase"] == "Running"
    _create(kube, namespace, "second", agent.node)
    status = _decided(kube, namespace, "second")
    assert status["phase"] == "Failed", status
    assert status["reason"] == SandboxReason.OVER_CAPACITY, status
    assert f"node {agent.node} is full" in status["message"], status
    assert "memory limit" in status["message"], status


def test_the_node_reports_its_memory_and_cpu_capacity(
    kube: client.ApiClient, start_agent: StartAgent
) -> None:
    agent = start_agent(capacity_cpu="3")

    def capacity() -> dict[str, Any] | None:
        node: Any = client.CustomObjectsApi(kube).get_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", agent.node
        )
        cap = dict((node.get("status") or {}).get("capacity") or {})
        return cap if "cpu" in cap else None

    cap = wait_for(capacity, timeout=20, what="the SandboxNode's capacity")
    assert cap["cpu"] == "3000m"
    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    assert int(cap["memory"]) == int(meminfo[1]) * 1024


def test_sandbox_logs_rotate_at_the_cap_and_go_with_the_sandbox(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    cap = 64 * 1024
    agent = start_agent(log_max_bytes=cap, log_interval="0.2s")
    script = "while true; do echo 0123456789abcdef0123456789abcdef; busybox usleep 200; done"
    uid = _create(kube, namespace, "chatty", agent.node, command=["sh", "-c", script])
    assert _decided(kube, namespace, "chatty")["phase"] == "Running"
    directory = Path(agent.settings.log_dir)
    (current,) = [p for p in directory.iterdir() if p.name.endswith(f"_{uid}.log")]
    rotated = current.with_name(current.name + ".1")
    wait_for(rotated.exists, timeout=60, what=f"{current.name} to be rotated at {cap} bytes")
    assert rotated.stat().st_size == cap
    # The output goes on in a new file, never over the cap.
    wait_for(lambda: current.stat().st_size > 0, timeout=20, what="output after the rotation")
    assert current.stat().st_size <= cap
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "chatty"
    )
    wait_for(
        lambda: not current.exists() and not rotated.exists(),
        timeout=60,
        what="the sandbox's log files to be removed after its teardown",
    )


def test_a_control_plane_nodes_taint_is_mirrored_onto_its_sandbox_node(
    kube: client.ApiClient, start_agent: StartAgent
) -> None:
    name = f"cp-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(kube)  # the body as plain JSON
    core.create_node(
        {
            "metadata": {"name": name},
            "spec": {"taints": [{"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}]},
        }
    )
    try:
        agent = start_agent(node=name)

        def taints() -> list[dict[str, Any]] | None:
            node: Any = client.CustomObjectsApi(kube).get_cluster_custom_object(
                GROUP, VERSION, "sandboxnodes", agent.node
            )
            return (node.get("status") or {}).get("nodeTaints")

        mirrored = wait_for(taints, timeout=20, what="the Node's taints on the SandboxNode")
        assert mirrored == [{"key": CONTROL_PLANE_TAINT, "value": "", "effect": "NoSchedule"}]
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)


def test_ephemeral_storage_is_admitted_against_the_nodes_disk_room(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent, containerd: PrivateContainerd
) -> None:
    """A sandbox without a disk limit gets the node's default (recorded on its
    container); with its namespace's default for one and its own limit for another,
    their sum against the room refuses the one that does not fit, naming ephemeral
    storage, while a smaller one still starts. The node reports its room: by default
    its disk below gcHigh."""
    client.CoreV1Api(kube).patch_namespace(
        namespace,
        {"metadata": {"annotations": {DEFAULT_LIMITS_ANNOTATION: "ephemeralStorage=3Gi"}}},
    )
    agent = start_agent(capacity_ephemeral_storage="6Gi", default_ephemeral_storage_limit="2Gi")
    uid = _create(kube, namespace, "ns-default-disk", agent.node)  # 3Gi, its namespace's
    assert _decided(kube, namespace, "ns-default-disk")["phase"] == "Running"
    labels = {c.id: c.labels for c in agent.parts.runtime.list_containers(timeout=5)}[
        container_id_for(uid)
    ]
    assert labels[EPHEMERAL_STORAGE_LABEL] == str(3 * 2**30)

    limit = {"resources": {"limits": {"ephemeralStorage": "4Gi"}}}
    _create(kube, namespace, "too-big", agent.node, **limit)
    status = _decided(kube, namespace, "too-big")
    assert (status["phase"], status["reason"]) == ("Failed", SandboxReason.OVER_CAPACITY), status
    assert "ephemeral-storage limit 4.00Gi does not fit: 3.00Gi of 6.00Gi" in status["message"]

    small = {"resources": {"limits": {"ephemeralStorage": "3Gi"}}}
    _create(kube, namespace, "fits", agent.node, **small)
    assert _decided(kube, namespace, "fits")["phase"] == "Running"

    plain = start_agent()  # no setting: its disk below gcHigh
    st = os.statvfs(containerd.root)

    def reported() -> dict[str, Any] | None:
        node: Any = client.CustomObjectsApi(kube).get_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", plain.node
        )
        cap = dict((node.get("status") or {}).get("capacity") or {})
        return cap if "ephemeralStorage" in cap else None

    cap = wait_for(reported, timeout=20, what="the SandboxNode's ephemeral storage capacity")
    assert int(cap["ephemeralStorage"]) == int(st.f_blocks * st.f_frsize * 85 / 100)


def test_capacity_counts_a_namespaces_default_limits(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    """The node counts what a start decided (its namespace's default, recorded on
    its container) and, for one waiting, its namespace's default before it starts:
    96Mi each, not the agent's 32Mi, so a second one does not fit in 150Mi."""
    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"annotations": {DEFAULT_LIMITS_ANNOTATION: "memory=96Mi"}}}
    )
    agent = start_agent(capacity_memory="150Mi", default_memory_limit="32Mi")
    uid = _create(kube, namespace, "first-ns", agent.node)
    assert _decided(kube, namespace, "first-ns")["phase"] == "Running"
    labels = {c.id: c.labels for c in agent.parts.runtime.list_containers(timeout=5)}
    assert labels[container_id_for(uid)][MEMORY_LIMIT_LABEL] == str(96 * 2**20)
    _create(kube, namespace, "second-ns", agent.node)
    status = _decided(kube, namespace, "second-ns")
    assert (status["phase"], status["reason"]) == ("Failed", SandboxReason.OVER_CAPACITY), status
    assert "memory limit 0.09Gi does not fit: 0.09Gi of 0.15Gi taken" in status["message"]
