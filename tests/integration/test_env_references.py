"""Secrets by reference, against the real API server, its RBAC and a private
containerd: a sandbox's ``env[].valueFrom`` and ``envFrom`` are brokered to its node
alone (``sandlot-pull-<node>``), the agent builds the environment from that copy,
the value reaches the sandbox's process and never the Sandbox object, another
node's identity cannot read it, and a missing key holds the sandbox Scheduled with
CreateContainerConfigError until the key exists.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.containerd.execs import open_execs
from sandlot.adapters.objects import Objects
from sandlot.adapters.pullsecrets import brokered_secret_name, write_brokered
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.controllers.pullcredentials import PullCredentialBroker, broker_node
from sandlot.devtools.controlplane import ControlPlane
from tests.support import agents
from tests.support.kube import as_node_identity
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/envrefs-busybox:test"
WAIT = 90.0
VALUE = f"s3cret-{uuid.uuid4().hex}"


@pytest.fixture
def agent(started_agent: Agent) -> Agent:
    return started_agent


def _secret(kube: client.ApiClient, namespace: str, name: str, data: dict[str, str]) -> None:
    encoded: dict[str, bytes | str] = {
        k: base64.b64encode(v.encode()).decode() for k, v in data.items()
    }
    client.CoreV1Api(kube).create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=name), data=encoded)
    )


def _sandbox(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    objs: Any = client.CustomObjectsApi(kube)
    found: dict[str, Any] = objs.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )
    return found


def _wait_phase(kube: client.ApiClient, namespace: str, name: str, phase: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        sb = _sandbox(kube, namespace, name)
        status = sb.get("status") or {}
        assert status.get("phase") in ("Scheduled", "Running"), status
        return sb if status.get("phase") == phase else None

    return wait_for(reached, timeout=WAIT, what=f"sandbox {name} {phase}")


def _process_has(agent: Agent, sb: dict[str, Any], variable: str) -> int:
    """The exit code of an exec checking that the sandbox's first process (not the
    exec's own) holds ``variable`` (``NAME=value``) in its environment."""
    settings = agent.settings
    execs = open_execs(
        settings.containerd_address,
        settings.containerd_namespace,
        str(Path(settings.state_dir) / "test-exec"),
    )
    container = sb["status"]["containerId"]
    exec_id = f"test-{uuid.uuid4().hex[:8]}"
    argv = ["sh", "-c", f"tr '\\0' '\\n' < /proc/1/environ | grep -qx '{variable}'"]
    try:
        process = execs.start(container, exec_id, argv, tty=False, stdin=False, timeout=10)
        try:
            return execs.wait(process, timeout=10)
        finally:
            process.release()
            execs.delete(container, exec_id, timeout=10)
    finally:
        execs.close()


def _start(kube: client.ApiClient, namespace: str, name: str, node: str, **spec: Any) -> None:
    body = {"image": IMAGE, "command": ["sleep", "300"], **spec}
    agents.schedule_sandbox(kube, namespace, name, node, body)


def test_a_secret_value_reaches_the_process_and_only_its_node(
    kube: client.ApiClient, control_plane: ControlPlane, namespace: str, agent: Agent
) -> None:
    _secret(kube, namespace, "db", {"password": VALUE, "user": "app"})
    client.CoreV1Api(kube).create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"LEVEL": "debug"}),
    )
    env = [
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
    ]
    _start(
        kube,
        namespace,
        "app",
        agent.node,
        env=env,
        envFrom=[{"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
    )
    broker_node(Objects(kube), namespace, agent.node)

    sb = _wait_phase(kube, namespace, "app", "Running")

    assert _process_has(agent, sb, f"DB_PASSWORD={VALUE}") == 0
    assert _process_has(agent, sb, "CFG_LEVEL=debug") == 0
    assert _process_has(agent, sb, "user=app") != 0, "a key nobody asked for reached it"
    assert VALUE not in json.dumps(_sandbox(kube, namespace, "app"))
    # The node's brokered copy holds the keys its sandboxes use, nothing else.
    brokered = client.CoreV1Api(kube).read_namespaced_secret(
        brokered_secret_name(agent.node), namespace
    )
    assert "app" not in json.dumps(
        [base64.b64decode(v).decode() for v in (brokered.data or {}).values()]
    )
    # Another node's identity is refused the copy.
    other = f"other-{uuid.uuid4().hex[:6]}"
    write_brokered(kube, namespace, other, {})
    as_other = as_node_identity(kube, control_plane, namespace, other)
    try:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(as_other).read_namespaced_secret(
                brokered_secret_name(agent.node), namespace
            )
        assert refused.value.status == 403
    finally:
        as_other.close()


def test_a_missing_key_waits_then_runs_once_it_exists(
    kube: client.ApiClient, namespace: str, agent: Agent
) -> None:
    _secret(kube, namespace, "api", {"other": "x"})
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}]
    _start(kube, namespace, "waiter", agent.node, env=env)
    broker = PullCredentialBroker(Objects(kube), lambda: True, namespace, retry_interval=0.5)
    try:
        # The test plays the operator's sandbox feed: each status it reads is an event.
        def holds() -> dict[str, Any] | None:
            sb = _sandbox(kube, namespace, "waiter")
            broker.on_sandbox("MODIFIED", sb)
            status = sb.get("status") or {}
            assert status.get("phase") == "Scheduled", status
            wanted = "couldn't find key token in Secret"
            return status if wanted in str(status.get("message")) else None

        status = wait_for(holds, timeout=WAIT, what="the sandbox to wait for its key")
        assert status["reason"] == "CreateContainerConfigError"
        assert status["message"] == f"couldn't find key token in Secret {namespace}/api"

        client.CoreV1Api(kube).patch_namespaced_secret(
            "api", namespace, {"stringData": {"token": VALUE}}
        )

        sb = _wait_phase(kube, namespace, "waiter", "Running")
        assert _process_has(agent, sb, f"TOKEN={VALUE}") == 0
        assert VALUE not in json.dumps(_sandbox(kube, namespace, "waiter"))
    finally:
        broker.close()


def test_the_api_server_refuses_value_and_value_from_together(
    kube: client.ApiClient, namespace: str
) -> None:
    env = [
        {
            "name": "A",
            "value": "inline",
            "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}},
        }
    ]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "both"},
        "spec": {"image": IMAGE, "env": env},
    }
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", body
        )
    assert refused.value.status == 422
    assert "value may not be specified when valueFrom is" in str(refused.value.body)
