"""A sandbox's disk use is bounded, claimed against the real API server and
containerd: a sandbox that writes past its ``ephemeralStorage`` limit into its
root filesystem ends Failed (EphemeralStorageExceeded, naming its use and its
limit) and its container goes, while a neighbour that wrote as much under a larger
limit keeps running once the pass has measured it; a namespace's default limit
(``sandlot.dev/default-limits``) bounds a sandbox that sets none."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from sandlot.agent.sandboxes import container_id_for
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import DEFAULT_LIMITS_ANNOTATION
from sandlot.api.reasons import SandboxReason
from tests.integration import test_agent_resources as resources
from tests.integration.test_agent_resources import StartAgent, _create, _decided
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

# The resource tests' busybox image and agents (pytest finds fixtures by name).
archive = resources.archive
start_agent = resources.start_agent

MI = 2**20
# 32 MiB into the root filesystem (the overlay's upper directory), then stay.
WRITE_32MI = ["sh", "-c", "busybox dd if=/dev/zero of=/big bs=1M count=32 && sleep 600"]
PASS = "0.3s"  # the agent's log interval, which the storage pass shares
DEADLINE = 60.0  # seconds for a write of 32 MiB and a pass or two, on a busy machine


def _status(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    sb: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )
    return dict(sb.get("status") or {})


def _failed(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return wait_for(
        lambda: (s := _status(kube, namespace, name)).get("phase") == "Failed" and s,
        timeout=DEADLINE,
        what=f"sandbox {name} to end Failed over its ephemeral storage limit",
    )


def _passes(agent: Agent) -> float:
    value = agent.registry.get_sample_value("sandlot_agent_ephemeral_storage_passes_total")
    return value or 0.0


def _containers(agent: Agent) -> set[str]:
    assert agent.runtime is not None
    return {c.id for c in agent.runtime.list_containers(timeout=10)}


def _assert_exceeded(status: dict[str, Any], limit_text: str) -> None:
    assert status["reason"] == SandboxReason.EPHEMERAL_STORAGE_EXCEEDED, status
    message = status["message"]
    assert f"over its limit of {limit_text}" in message, message
    used = re.search(r"\((\d+) bytes, writable layer and logs\)", message)
    assert used is not None and int(used[1]) > 8 * MI, message


def test_a_sandbox_over_its_limit_fails_while_a_roomier_neighbour_runs(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    agent = start_agent(log_interval=PASS)
    _create(
        kube,
        namespace,
        "hog",
        agent.node,
        command=WRITE_32MI,
        resources={"limits": {"ephemeralStorage": "8Mi"}},
    )
    roomy_uid = _create(
        kube,
        namespace,
        "roomy",
        agent.node,
        command=WRITE_32MI,
        resources={"limits": {"ephemeralStorage": "256Mi"}},
    )
    hog = _failed(kube, namespace, "hog")
    _assert_exceeded(hog, "8.0Mi")
    hog_container = hog["containerId"]
    wait_for(
        lambda: hog_container not in _containers(agent),
        timeout=DEADLINE,
        what=f"the container {hog_container} of the stopped sandbox to be torn down",
    )

    # The pass saw the neighbour's 32 MiB, then ran again: it was judged, and kept.
    roomy = container_id_for(roomy_uid)

    def measured_full() -> bool:
        use = agent.parts.storage.measured.get(roomy)
        return use is not None and use.bytes >= 32 * MI

    wait_for(measured_full, timeout=DEADLINE, what="the pass to measure roomy's 32 MiB")
    seen = _passes(agent)
    wait_for(lambda: _passes(agent) >= seen + 2, timeout=DEADLINE, what="two more storage passes")
    status = _status(kube, namespace, "roomy")
    assert status["phase"] == "Running", status
    assert roomy in _containers(agent)


def test_a_namespace_default_bounds_a_sandbox_without_its_own_limit(
    kube: client.ApiClient, namespace: str, start_agent: StartAgent
) -> None:
    client.CoreV1Api(kube).patch_namespace(
        namespace,
        {"metadata": {"annotations": {DEFAULT_LIMITS_ANNOTATION: "ephemeralStorage=8Mi"}}},
    )
    agent = start_agent(log_interval=PASS)
    quiet_uid = _create(kube, namespace, "quiet", agent.node, command=["sleep", "600"])
    _create(kube, namespace, "writer", agent.node, command=WRITE_32MI)
    _assert_exceeded(_failed(kube, namespace, "writer"), "8.0Mi")

    # The one under the default was measured, well under it, and keeps running.
    quiet = container_id_for(quiet_uid)
    assert _decided(kube, namespace, "quiet")["phase"] == "Running"
    wait_for(
        lambda: quiet in agent.parts.storage.measured,
        timeout=DEADLINE,
        what="the pass to measure the quiet sandbox",
    )
    assert agent.parts.storage.measured[quiet].bytes < MI, agent.parts.storage.measured[quiet]
    seen = _passes(agent)
    wait_for(lambda: _passes(agent) >= seen + 2, timeout=DEADLINE, what="two more storage passes")
    assert _status(kube, namespace, "quiet")["phase"] == "Running"
