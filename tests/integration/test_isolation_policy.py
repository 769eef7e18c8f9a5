"""A sandbox's security level, claimed against the real things.

- The API server: the admission policy (``sandlot.api.admission``) installed as a
  real ValidatingAdmissionPolicy refuses what a namespace's level forbids, with
  the message users see, and agrees with the agent's Python check case by case;
  the chart renders the same policy.
- The agent, on containerd + runc: it refuses what the level forbids when no
  admission policy saw the sandbox, runs what the namespace's label allows, and
  reports a process over its memory limit as OOMKilled.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from sandlot.api.admission import POLICY_NAME, Level, admission_policy
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import LEVEL_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.podsecurity import check
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration]


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
            return str(json.loads(exc.body or "")["message"])
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
    adm: Any = client.AdmissionregistrationV1Api(kube)  # bodies as plain JSON
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
    adm: Any = client.AdmissionregistrationV1Api(kube)  # bodies as plain JSON
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
    stored: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
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
    assert "spec.hostNetwork is not allowed" in json.loads(refused.value.body or "")["message"]


# (level label, spec) pairs: the API server and the agent's check must agree on each.
AGREEMENT_CASES: list[tuple[str | None, dict[str, Any]]] = [
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
        sb: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
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


# -------------------------------------------------------- the chart renders the same policy


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
