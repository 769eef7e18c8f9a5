"""Images per credential and registries on private addresses, with a real agent, the
real API server, a private containerd and a real registry behind htpasswd on
loopback: tenant A pulls ``private`` with its credential; tenant B (no credential)
may run it only once the registry accepts B, under the default policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.pullsecrets import brokered_key, write_brokered
from sandlot.agent.main import Agent
from tests.support.agentpulls import (
    AgentFactory,
    create_sandbox,
    dockerconfig,
    node_name,
    pulls,
    status_of,
    wait_phase,
)
from tests.support.registry import AUTH_PASSWORD, AUTH_USER, Registry
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

A_SECRET = [{"name": "tenant-a"}]


def verifications(agent: Agent, outcome: str) -> float:
    value = agent.registry.get_sample_value(
        "sandlot_agent_image_verifications_total", {"outcome": outcome}
    )
    return value or 0.0


def _a_has_run(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    image: Any,
    start_pull_agent: AgentFactory,
    **settings: Any,
) -> tuple[str, Agent]:
    """A node whose brokered Secret holds tenant A's pull secret, its agent (with
    ``settings``), and A's sandbox ``a1`` Running from ``image``, pulled for it."""
    node = node_name()
    secret = dockerconfig(registry.host, AUTH_USER, AUTH_PASSWORD)
    write_brokered(kube, namespace, node, {brokered_key(namespace, "tenant-a"): secret})
    agent = start_pull_agent(kube, namespace, node, **settings)
    create_sandbox(kube, namespace, "a1", node, image.name, imagePullSecrets=A_SECRET)
    wait_phase(kube, namespace, "a1", "Running")
    return node, agent


def test_another_tenant_is_refused_a_private_image_and_its_failures_stay_its_own(
    kube: client.ApiClient,
    namespace: str,
    auth_registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
) -> None:
    pushed = push_image(auth_registry, "access/private:1", salt="access-private")
    node, agent = _a_has_run(kube, namespace, auth_registry, pushed, start_pull_agent)

    create_sandbox(kube, namespace, "b1", node, pushed.name)

    status = wait_phase(kube, namespace, "b1", "Failed")
    assert status["reason"] == "ErrImagePull", status
    assert "HTTP 401 Unauthorized" in status["message"], status
    assert verifications(agent, "unauthorized") == 3  # then the back-off policy said: fail
    assert pulls(agent, "success") == 1 and pulls(agent, "unauthorized") == 0  # no pull for B
    # B's three refusals are B's: A's next sandbox runs the image at once.
    create_sandbox(kube, namespace, "a2", node, pushed.name, imagePullSecrets=A_SECRET)
    wait_phase(kube, namespace, "a2", "Running")
    assert pulls(agent, "success") == 1


def test_verified_pairs_survive_an_agent_restart(
    kube: client.ApiClient,
    namespace: str,
    auth_registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    """After the restart the registry is out of reach (its loopback host no longer
    listed): A's sandbox can run only from the record its pull left on disk, and B,
    never verified, cannot."""
    pushed = push_image(auth_registry, "access/restart:1", salt="access-restart")
    node, first = _a_has_run(kube, namespace, auth_registry, pushed, start_pull_agent)
    first.shutdown()
    records = json.loads((tmp_path / "agent-state" / f"image-access-{node}.json").read_text())
    assert pushed.name in records["images"], records

    second = start_pull_agent(kube, namespace, node, registry_private_hosts=[])
    create_sandbox(kube, namespace, "a2", node, pushed.name, imagePullSecrets=A_SECRET)
    create_sandbox(kube, namespace, "b2", node, pushed.name)

    wait_phase(kube, namespace, "a2", "Running")
    status = wait_for(
        lambda: (s := status_of(kube, namespace, "b2")).get("reason") == "ImagePullBackOff" and s,
        timeout=60,
        what="b2 backing off its refused verification",
    )
    assert status["phase"] == "Scheduled", status
    assert "registry_private_hosts" in status["message"], status
    assert verifications(second, "success") == 0


def test_never_verify_runs_another_tenant_from_the_image_the_node_has(
    kube: client.ApiClient,
    namespace: str,
    auth_registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
) -> None:
    pushed = push_image(auth_registry, "access/shared:1", salt="access-shared")
    node, agent = _a_has_run(
        kube,
        namespace,
        auth_registry,
        pushed,
        start_pull_agent,
        image_pull_credentials_verification_policy="NeverVerify",
    )

    create_sandbox(kube, namespace, "b1", node, pushed.name)

    wait_phase(kube, namespace, "b1", "Running")
    assert pulls(agent, "success") == 1
    assert sum(verifications(agent, o) for o in ("success", "unauthorized")) == 0


def test_a_loopback_registry_is_refused_unless_listed(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
) -> None:
    """The same registry runs under the default test settings (it is listed there):
    ``test_agent_pulls.py``."""
    public = push_image(registry, "access/loopback:1", salt="access-loopback")
    node = node_name()
    agent = start_pull_agent(kube, namespace, node, registry_private_hosts=[])

    create_sandbox(kube, namespace, "unlisted", node, public.name)

    status = wait_for(
        lambda: (
            (s := status_of(kube, namespace, "unlisted")).get("reason") == "ImagePullBackOff" and s
        ),
        timeout=60,
        what="the unlisted loopback registry refused",
    )
    assert "127.0.0.1" in status["message"] and "registry_private_hosts" in status["message"]
    assert pulls(agent, "transient") >= 1 and pulls(agent, "success") == 0


def test_a_refusal_shows_the_status_and_code_never_the_registry_text(
    kube: client.ApiClient,
    namespace: str,
    auth_registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
) -> None:
    private = push_image(auth_registry, "access/words:1", salt="access-words")
    node = node_name()
    start_pull_agent(kube, namespace, node)

    create_sandbox(kube, namespace, "words", node, private.name)

    refused = wait_phase(kube, namespace, "words", "Failed")
    # docker-registry's own words ("authentication required") never reach the status.
    assert "HTTP 401 Unauthorized (UNAUTHORIZED)" in refused["message"], refused
    assert "authentication required" not in refused["message"], refused
