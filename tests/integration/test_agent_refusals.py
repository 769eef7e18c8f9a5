"""What the agent refuses, and what it does when it is refused, claimed against the
real kube-apiserver and containerd:

- a sandbox whose ``spec.nodeName`` was set by hand onto a node with a taint it
  does not tolerate ends Failed (PlacementRefused); one that tolerates it runs;
- a sandbox reported at the node's address (host-address mode) publishing a port
  the node serves itself (the kubelet's 10250) ends Failed (ReservedHostPort);
- a sandbox asking for isolation the node cannot give (an AppArmor profile that
  is not loaded) ends Failed with a reason naming it, and no container is
  created; one asking for a user namespace (``hostUsers: false``), which this
  node gives, runs in a host ID range of its own;

- refused for good (a 4xx other than 409; here a ValidatingAdmissionPolicy denies
  the write with 422): the agent does not start the sandbox again and write again
  every sync pass, it backs off;
- failing with a 5xx (here an admission webhook that cannot be reached, which the
  API server answers with 500): the container that just started is kept, and its
  Running is written once the API server takes it again.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import TaskState
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import USERNS_LABEL
from sandlot.api.placement import CONTROL_PLANE_TAINT
from sandlot.api.reasons import SandboxReason
from sandlot.policy.userns import IdRange
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.passes import agent_passes, wait_agent_passes
from tests.support.strict_skips import kernel_has_apparmor
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/status-busybox:test"
DENY_LABEL = "sandlot-test/deny-status"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


@pytest.fixture
def ctr_ns(containerd: PrivateContainerd, archive: Path) -> Iterator[str]:
    with agents.containerd_namespace(containerd, "st", archive) as ns:
        yield ns


@pytest.fixture
def agent(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    tmp_path: Path,
) -> Iterator[Agent]:
    node = f"node-{uuid.uuid4().hex[:8]}"
    with agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs") as fleet:
        # A pass every second even with nothing to wake it: tests count passes.
        yield fleet.start(kube, namespace, node, sync_interval="1s", resync_interval="1s")
    agents.delete_node(kube, node)


def _create(
    kube: client.ApiClient, namespace: str, name: str, node: str, mark: str, **spec: Any
) -> None:
    spec = {"image": IMAGE, **spec}
    agents.schedule_sandbox(kube, namespace, name, node, spec, labels={DENY_LABEL: mark})


def _get(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    objs: Any = client.CustomObjectsApi(kube)
    return dict(objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name))


def _status_write_refused(
    kube: client.ApiClient, namespace: str, name: str, phase: str = "Failed"
) -> str | None:
    try:
        client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            name,
            {"status": {"phase": phase, "message": "probe"}},
            dry_run="All",
        )
    except client.ApiException as exc:
        return f"{exc.status}"
    return None


@contextlib.contextmanager
def _deny_failed_status(kube: client.ApiClient, mark: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy refusing (422) a Failed status on Sandboxes with
    the mark."""
    adm: Any = client.AdmissionregistrationV1Api(kube)  # bodies as plain JSON
    name = f"deny-failed-{mark}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["UPDATE"],
                        "resources": ["sandboxes/status"],
                    }
                ],
                "objectSelector": {"matchLabels": {DENY_LABEL: mark}},
            },
            "validations": [
                {
                    "expression": "!has(object.status) || !has(object.status.phase) "
                    "|| object.status.phase != 'Failed'",
                    "message": "Failed is not accepted for this test sandbox",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    try:
        yield
    finally:
        with contextlib.suppress(client.ApiException):
            adm.delete_validating_admission_policy_binding(name)
        with contextlib.suppress(client.ApiException):
            adm.delete_validating_admission_policy(name)


def test_a_refused_failure_write_is_not_retried_every_pass(
    kube: client.ApiClient,
    namespace: str,
    agent: Agent,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mark = uuid.uuid4().hex[:8]
    with _deny_failed_status(kube, mark):
        # The policy takes effect asynchronously: a marked probe's dry run says when.
        probe = f"probe-{mark}"
        _create(kube, namespace, probe, f"nowhere-{mark}", mark)
        wait_for(
            lambda: _status_write_refused(kube, namespace, probe) == "422",
            timeout=30,
            interval=0.2,
            what="the admission policy to refuse a Failed status",
        )
        caplog.set_level(logging.WARNING, logger="sandlot.agent.starts")
        # The image is not on the node and not to be pulled: every start ends in a
        # Failed write, refused.
        _create(
            kube,
            namespace,
            "nope",
            agent.node,
            mark,
            image="docker.io/sandlot/absent:1",
            imagePullPolicy="Never",
        )

        def starts() -> int:
            failed = "sandbox " + namespace + "/nope failed: ImageNotFound"
            return sum(failed in r.getMessage() for r in caplog.records)

        wait_for(lambda: starts() >= 1, timeout=30, what="the agent to try the sandbox")
        # Six passes, each of which would try again if a refused write were retried hot.
        wait_agent_passes(agent, agent_passes(agent), 6, timeout=30)
        assert starts() <= 2, f"{starts()} tries in six passes: the refused write is retried hot"
        assert (_get(kube, namespace, "nope").get("status") or {}).get("phase") == "Scheduled"


@contextlib.contextmanager
def _status_webhook_down(kube: client.ApiClient, mark: str) -> Iterator[None]:
    """An admission webhook nobody answers, failurePolicy Fail, on the marked
    Sandboxes' status writes that say Running: the API server answers them with 500."""
    adm: Any = client.AdmissionregistrationV1Api(kube)  # bodies as plain JSON
    name = f"down-{mark}.sandlot.test"
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": name,
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                "rules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["UPDATE"],
                        "resources": ["sandboxes/status"],
                    }
                ],
                "objectSelector": {"matchLabels": {DENY_LABEL: mark}},
                "matchConditions": [
                    {
                        "name": "running",
                        "expression": "has(object.status) && has(object.status.phase) "
                        "&& object.status.phase == 'Running'",
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    adm.create_validating_webhook_configuration(body)
    try:
        yield
    finally:
        with contextlib.suppress(client.ApiException):
            adm.delete_validating_webhook_configuration(name)


def test_a_running_write_failing_with_5xx_keeps_the_started_container(
    kube: client.ApiClient,
    namespace: str,
    agent: Agent,
    containerd: PrivateContainerd,
    ctr_ns: str,
) -> None:
    mark = uuid.uuid4().hex[:8]
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    try:
        with _status_webhook_down(kube, mark):
            probe = f"probe-{mark}"
            _create(kube, namespace, probe, f"nowhere-{mark}", mark)
            wait_for(
                lambda: _status_write_refused(kube, namespace, probe, "Running") == "500",
                timeout=30,
                interval=0.2,
                what="the unreachable webhook to fail status writes with 500",
            )
            _create(kube, namespace, "busy", agent.node, mark, command=["sleep", "300"])
            task = wait_for(
                lambda: next(
                    (t for t in rt.list_tasks(timeout=5) if t.state is TaskState.RUNNING), None
                ),
                timeout=30,
                what="the sandbox's task to run",
            )
            # Several passes, each seeing it Scheduled beside its container.
            wait_agent_passes(agent, agent_passes(agent), 4, timeout=30)
            still = rt.get_task(task.container_id, timeout=5)
            assert still is not None and still.state is TaskState.RUNNING, still
            assert still.pid == task.pid, "the container was replaced"
            assert _get(kube, namespace, "busy")["status"]["phase"] == "Scheduled"

        def running() -> dict[str, Any] | None:
            status = _get(kube, namespace, "busy").get("status") or {}
            return status if status.get("phase") == "Running" else None

        status = wait_for(running, timeout=45, what="Running written once the API server takes it")
        assert status["containerId"] == task.container_id
        assert status["pid"] == task.pid
    finally:
        rt.close()


def test_host_users_false_runs_each_sandbox_in_a_host_id_range_of_its_own(
    kube: client.ApiClient,
    namespace: str,
    agent: Agent,
    containerd: PrivateContainerd,
    ctr_ns: str,
) -> None:
    names = ("userns-a", "userns-b")
    for name in names:
        _create(kube, namespace, name, agent.node, "none", hostUsers=False, command=["sleep", "60"])

    def running(name: str) -> dict[str, Any] | None:
        status = _get(kube, namespace, name).get("status") or {}
        assert status.get("phase") != "Failed", status
        return status if status.get("phase") == "Running" else None

    statuses = [
        wait_for(partial(running, n), timeout=60, what=f"{n} to run in a user namespace")
        for n in names
    ]
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    try:
        labels = {c.id: c.labels.get(USERNS_LABEL) for c in rt.list_containers(timeout=5)}
    finally:
        rt.close()
    first, second = (IdRange.from_label(labels[s["containerId"]] or "") for s in statuses)
    assert first is not None and second is not None, labels
    assert not first.overlaps(second), (first, second)
    for status, ids in zip(statuses, (first, second), strict=True):
        uid_map = Path(f"/proc/{status['pid']}/uid_map").read_text().split()
        assert uid_map == ["0", str(ids.first), str(ids.size)], uid_map
        host_uid = Path(f"/proc/{status['pid']}/status").read_text().split("Uid:")[1].split()[0]
        assert host_uid == str(ids.first), "root inside is not the range's first host ID"


def _decided(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    def decided() -> dict[str, Any] | None:
        status = _get(kube, namespace, name).get("status") or {}
        return status if status.get("phase") in ("Failed", "Running") else None

    return wait_for(decided, timeout=30, what=f"the agent to start or refuse {name}")


def test_the_agent_detects_whether_the_kernel_has_apparmor(agent: Agent) -> None:
    loaded = agent.parts.work.facts.security.apparmor_profiles
    assert (loaded is not None) is kernel_has_apparmor(), "the agent misdetected AppArmor"


def test_without_apparmor_in_the_kernel_a_sandbox_runs_unconfined(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    if kernel_has_apparmor():
        pytest.skip("this host's kernel has AppArmor: the confined case is tested instead")
    _create(kube, namespace, "aa-none", agent.node, "none", command=["sleep", "30"])
    status = _decided(kube, namespace, "aa-none")
    assert status["phase"] == "Running", status


@pytest.mark.apparmor
def test_apparmor_profile_is_applied_where_the_kernel_has_apparmor(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    """The sandbox runs confined by the configured profile, or fails naming it when
    the profile is not loaded."""
    if not kernel_has_apparmor():
        pytest.skip("this host's kernel has no AppArmor enabled: nothing can confine here")
    loaded = agent.parts.work.facts.security.apparmor_profiles
    _create(kube, namespace, "aa", agent.node, "none", command=["sleep", "30"])
    status = _decided(kube, namespace, "aa")
    wanted = agent.settings.apparmor_profile
    if wanted not in (loaded or ()):
        assert status["phase"] == "Failed", status
        assert (
            status["reason"] == SandboxReason.APPARMOR_PROFILE_MISSING
            and wanted in status["message"]
        )
        return
    assert status["phase"] == "Running", status
    label = Path(f"/proc/{status['pid']}/attr/current").read_text().strip()
    assert label.startswith(wanted), label


def test_a_hand_set_node_name_onto_a_tainted_node_is_refused_unless_tolerated(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    api = client.CustomObjectsApi(kube)
    taint = {"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}
    api.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", agent.node, {"spec": {"taints": [taint]}}
    )
    wait_for(
        lambda: ((agent.node_watch.get(agent.node) or {}).get("spec") or {}).get("taints"),
        timeout=20,
        what="the agent to see its node's taint",
    )
    _create(kube, namespace, "intruder", agent.node, "none", command=["sleep", "30"])
    tolerated = [{"key": CONTROL_PLANE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    _create(
        kube, namespace, "guest", agent.node, "none", command=["sleep", "30"], tolerations=tolerated
    )

    def decided(name: str) -> dict[str, Any] | None:
        status = _get(kube, namespace, name).get("status") or {}
        return status if status.get("phase") in ("Failed", "Running") else None

    refused = wait_for(lambda: decided("intruder"), timeout=30, what="the intruder's end")
    assert refused["phase"] == "Failed", refused
    assert refused["reason"] == "PlacementRefused", refused
    assert f"untolerated taint {{{CONTROL_PLANE_TAINT}:NoSchedule}}" in refused["message"]
    admitted = wait_for(lambda: decided("guest"), timeout=30, what="the guest to start")
    assert admitted["phase"] == "Running", admitted


def test_a_sandbox_at_the_nodes_address_may_not_publish_a_port_the_node_serves(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    tmp_path: Path,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    with agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs") as fleet:
        fleet.start(kube, namespace, node, sync_interval="1s", network_mode="host-address")
        kubelet = [
            {"name": "web", "containerPort": 8080},
            {"name": "kubelet", "containerPort": 10250},
        ]
        _create(kube, namespace, "squatter", node, "none", command=["sleep", "30"], ports=kubelet)
        own = [{"name": "web", "containerPort": 8080}]
        _create(kube, namespace, "tenant", node, "none", command=["sleep", "30"], ports=own)

        def decided(name: str) -> dict[str, Any] | None:
            status = _get(kube, namespace, name).get("status") or {}
            return status if status.get("phase") in ("Failed", "Running") else None

        refused = wait_for(lambda: decided("squatter"), timeout=30, what="the squatter's end")
        assert refused["phase"] == "Failed", refused
        assert refused["reason"] == "ReservedHostPort", refused
        assert "spec.ports: 10250" in refused["message"], refused
        admitted = wait_for(lambda: decided("tenant"), timeout=30, what="the tenant to start")
        assert admitted["phase"] == "Running", admitted
    agents.delete_node(kube, node)
