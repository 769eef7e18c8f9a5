"""The agent pulls its sandboxes' images: a real registry on loopback, the real API
server and a private containerd, with ``imagePullPolicy``, pull secrets brokered to
the node, the status story (Pulling -> Running, ImagePullBackOff -> Failed) and
shared pulls. The public and shared pulls run on containerd 2.x too (client-side,
the agent's default; the daemon's Transfer path is ``test_image_pull_transfer.py``'s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.pullsecrets import brokered_key, write_brokered
from tests.support.agentpulls import (
    AgentFactory,
    StatusLog,
    create_sandbox,
    dockerconfig,
    node_name,
    pulls,
    status_of,
    wait_phase,
)
from tests.support.containerd import PrivateContainerd
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.registry import AUTH_PASSWORD, AUTH_USER, Registry, StallingProxy
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


@EVERY_CONTAINERD
def test_public_image_is_pulled_then_runs_and_the_status_told_so(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
    status_log: StatusLog,
) -> None:
    pushed = push_image(registry, "agent/public:1", salt="agent-public", filler_bytes=1 << 20)
    node = node_name()
    agent = start_pull_agent(kube, namespace, node)

    create_sandbox(kube, namespace, "public", node, pushed.name)

    status = wait_phase(kube, namespace, "public", "Running")
    assert status.get("imagePull") is None
    # The watch may deliver the Running event a moment after the read saw it.
    reasons = wait_for(
        lambda: (r := status_log.reasons("public")) and "Started" in r and r,
        timeout=10,
        what="the watch to see the Running status",
    )
    assert "Pulling" in reasons and reasons.index("Pulling") < reasons.index("Started"), reasons
    assert pulls(agent, "success") == 1
    fetched = agent.registry.get_sample_value("sandlot_agent_image_pull_bytes_total") or 0
    assert fetched >= 1 << 20


@EVERY_CONTAINERD
def test_two_sandboxes_of_one_image_share_one_pull(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
) -> None:
    pushed = push_image(registry, "agent/shared:1", salt="agent-shared", filler_bytes=4 << 20)
    node = node_name()
    agent = start_pull_agent(kube, namespace, node)

    create_sandbox(kube, namespace, "one", node, pushed.name)
    create_sandbox(kube, namespace, "two", node, pushed.name)

    wait_phase(kube, namespace, "one", "Running")
    wait_phase(kube, namespace, "two", "Running")
    assert pulls(agent, "success") == 1


@pytest.mark.parametrize(
    ("password", "phase", "reason"),
    [(AUTH_PASSWORD, "Running", "Started"), ("wrong", "Failed", "ErrImagePull")],
    ids=["right-credential", "wrong-credential"],
)
def test_protected_image_with_a_pull_secret_brokered_to_the_node(
    kube: client.ApiClient,
    namespace: str,
    auth_registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
    status_log: StatusLog,
    password: str,
    phase: str,
    reason: str,
) -> None:
    pushed = push_image(auth_registry, "agent/private:1", salt="agent-private")
    node = node_name()
    write_brokered(
        kube,
        namespace,
        node,
        {brokered_key(namespace, "regcred"): dockerconfig(auth_registry.host, AUTH_USER, password)},
    )
    agent = start_pull_agent(kube, namespace, node)

    create_sandbox(
        kube, namespace, "private", node, pushed.name, imagePullSecrets=[{"name": "regcred"}]
    )

    status = wait_phase(kube, namespace, "private", phase)
    assert status["reason"] == reason
    if phase == "Failed":
        assert "UNAUTHORIZED" in status["message"]
        wait_for(
            lambda: "ImagePullBackOff" in status_log.reasons("private"),
            timeout=10,
            what="the watch to have seen ImagePullBackOff",
        )
        assert pulls(agent, "unauthorized") == 3  # then the back-off policy said: fail


def test_missing_tag_backs_off_then_fails_with_its_error_code(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
    status_log: StatusLog,
) -> None:
    push_image(registry, "agent/tagged:present", salt="agent-tagged")
    node = node_name()
    agent = start_pull_agent(kube, namespace, node)

    create_sandbox(kube, namespace, "absent", node, registry.ref("agent/tagged:absent"))

    status = wait_phase(kube, namespace, "absent", "Failed")
    assert status["reason"] == "ErrImagePull"
    assert "MANIFEST_UNKNOWN" in status["message"]
    wait_for(
        lambda: "ImagePullBackOff" in status_log.reasons("absent"),
        timeout=10,
        what="the watch to have seen ImagePullBackOff",
    )
    assert pulls(agent, "not_found") == 3


def test_never_with_a_missing_image_fails_without_a_pull(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
) -> None:
    pushed = push_image(registry, "agent/never:1", salt="agent-never")
    node = node_name()
    agent = start_pull_agent(kube, namespace, node)

    create_sandbox(kube, namespace, "never", node, pushed.name, imagePullPolicy="Never")

    status = wait_phase(kube, namespace, "never", "Failed")
    assert status["reason"] == "ImageNotFound"
    assert "imagePullPolicy is Never" in status["message"]
    assert sum(pulls(agent, o) for o in ("success", "not_found", "unauthorized", "transient")) == 0


def test_always_pulls_a_moved_tag_and_if_not_present_does_not(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
    containerd: PrivateContainerd,
    pull_ctr_ns: str,
) -> None:
    first = push_image(registry, "agent/moving:v", salt="agent-moving-1")
    node = node_name()
    agent = start_pull_agent(kube, namespace, node)
    create_sandbox(kube, namespace, "first", node, first.name)
    wait_phase(kube, namespace, "first", "Running")

    moved = push_image(registry, "agent/moving:v", salt="agent-moving-2")
    create_sandbox(kube, namespace, "lazy", node, moved.name)  # IfNotPresent: no pull
    wait_phase(kube, namespace, "lazy", "Running")
    assert pulls(agent, "success") == 1
    create_sandbox(kube, namespace, "eager", node, moved.name, imagePullPolicy="Always")
    wait_phase(kube, namespace, "eager", "Running")

    assert pulls(agent, "success") == 2
    rt = ContainerdRuntime(containerd.address, pull_ctr_ns)
    try:
        record = next(r for r in rt.list_images(timeout=10) if r.name == moved.name)
    finally:
        rt.close()
    assert record.target_digest == moved.manifest_digest != first.manifest_digest


def test_stalling_registry_backs_off_and_the_sandbox_stays_scheduled(
    kube: client.ApiClient,
    namespace: str,
    registry: Registry,
    push_image: Any,
    start_pull_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    pushed = push_image(registry, "agent/stall:1", salt="agent-stall", filler_bytes=4 << 20)
    proxy = StallingProxy(registry.port, stall_after=256 * 1024)
    hosts = tmp_path / "hosts" / pushed.name.split("/", 1)[0]
    hosts.mkdir(parents=True)
    # The node's hosts.toml sends this registry's pulls through the stalling proxy.
    (hosts / "hosts.toml").write_text(f'server = "http://{proxy.host}"\n')
    node = node_name()
    try:
        agent = start_pull_agent(kube, namespace, node, registry_config_dir=str(tmp_path / "hosts"))
        create_sandbox(kube, namespace, "stalled", node, pushed.name)

        status = wait_for(
            lambda: (
                (s := status_of(kube, namespace, "stalled")).get("reason") == "ImagePullBackOff"
                and s
            ),
            timeout=30,
            what="sandbox stalled in ImagePullBackOff",
        )
        assert status["phase"] == "Scheduled"
        assert "stalled" in status["message"]
        wait_for(lambda: pulls(agent, "transient") >= 2, timeout=30, what="a retried pull")
        assert status_of(kube, namespace, "stalled")["phase"] == "Scheduled"
    finally:
        proxy.close()
