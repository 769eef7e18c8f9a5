"""Fixtures for ``sandlot logs`` / ``sandlot exec`` tests: the real API server
proxying the aggregated API ``subresources.sandlot.dev`` to a real stream gateway,
which reaches a real agent over mutual TLS, and ServiceAccount callers with real
tokens and RBAC.

The gateway and the agent's stream server listen on an address of an interface
these fixtures create (the API server refuses loopback endpoints), recorded as
the gateway's endpoint and the IP of the agent's stand-in Pod, as the demo does.
``operator-person`` holds what the chart's ``sandlot-edit`` grants in the tenant's
namespace, ``onlooker`` what ``sandlot-view`` grants; neither has ``pods/proxy``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.agentpods import publish_agent_pod, remove_agent_pod
from sandlot.agent import streams as agent_streams
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.containerd import PrivateContainerd
from sandlot.devtools.controlplane import (
    ControlPlane,
    executor_path,
    files_tool_path,
    free_port,
    kubeconfig_dict,
)
from sandlot.devtools.gatewayrig import running_gateway
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from sandlot.devtools.streamnet import StreamAddress, can_create
from sandlot.gateway.runner import GatewayParts
from sandlot.policy.streams import SUBRESOURCE_GROUP
from tests.support.agents import agent_settings, clear_namespace
from tests.support.wait import wait_for

IMAGE = "docker.io/sandlot/agent-busybox:test"
CLI_TIMEOUT = 60


@pytest.fixture(scope="module")
def stream_address() -> Iterator[StreamAddress]:
    if not can_create():
        pytest.skip("creating the stream address's interface needs root")
    with StreamAddress() as address:
        yield address


def _create_namespace(kube: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(kube)  # bodies as plain JSON
    core.create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture(scope="module")
def places(kube: client.ApiClient) -> Iterator[tuple[str, str]]:
    """(the agent's namespace, the tenant's namespace)."""
    system, tenant = _create_namespace(kube, "sys"), _create_namespace(kube, "tenant")
    yield system, tenant
    for name in (system, tenant):
        client.CoreV1Api(kube).delete_namespace(name)


@pytest.fixture(scope="module")
def stream_certs(
    places: tuple[str, str], stream_address: StreamAddress, tmp_path_factory: pytest.TempPathFactory
) -> StreamCerts:
    system, _ = places
    return StreamCerts.create(tmp_path_factory.mktemp("certs"), system, (stream_address.ip,))


@pytest.fixture(scope="module")
def gateway(
    kube: client.ApiClient,
    places: tuple[str, str],
    stream_address: StreamAddress,
    stream_certs: StreamCerts,
) -> Iterator[GatewayParts]:
    system, _ = places
    # The rig runs the gateway, the agent and the test's clients in one process: under
    # a whole run's start-up load the production 10 s wait for an agent's upgrade
    # answer expired (502 "timed out while waiting for handshake response") in two
    # tests whose claims are not about that wait, so the rig's gateway (and agent,
    # below) wait 30 s.
    with running_gateway(
        kube, stream_certs, system, stream_address.ip, call_timeout="30s"
    ) as parts:
        yield parts


@contextmanager
def stream_agent(
    kube: client.ApiClient,
    containerd: PrivateContainerd,
    system: str,
    stream_address: StreamAddress,
    stream_certs: StreamCerts,
    workdir: Path,
    *,
    prefix: str,
    handshake_timeout: float | None = None,
    **overrides: Any,
) -> Iterator[Agent]:
    """An in-process agent serving streams on ``stream_address`` with the rig's
    certificates, on a fresh containerd namespace (``PREFIX-...``) holding ``IMAGE``,
    its stand-in Pod published in ``system``; ``overrides`` are its settings beyond
    the rig's. All of it is removed after."""
    ctr_ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
    archive = workdir / "busybox.tar"
    build_image_archive(archive, IMAGE)
    import_archive(containerd.address, ctr_ns, archive, timeout=60)
    node = f"node-{uuid.uuid4().hex[:8]}"
    port = free_port()
    pod = f"sandlot-agent-{node}"
    publish_agent_pod(kube, system, pod, stream_address.ip, port, node)
    settings = agent_settings(
        node=node,
        namespace=system,
        containerd=containerd,
        ctr_ns=ctr_ns,
        log_dir=workdir / "logs",
        stream_port=port,
        stream_bind=stream_address.ip,
        stream_tls_cert=str(stream_certs.agent(node).cert),
        stream_tls_key=str(stream_certs.agent(node).key),
        stream_client_ca=str(stream_certs.ca.cert),
        **{
            "files_tool": str(files_tool_path()),
            "executor": str(executor_path()),
            # The product's bound, not the rig's 2 s: these agents serve users'
            # commands and file calls, each an exec into a task, beside a full
            # parallel run; no test here waits for a containerd call to expire.
            "call_timeout": "5s",
            **overrides,
        },
    )
    started = Agent(settings, kube, registry=CollectorRegistry())
    try:
        # Read when the agent's stream server starts.
        with (
            mock.patch.object(agent_streams, "HANDSHAKE_TIMEOUT", handshake_timeout)
            if handshake_timeout is not None
            else nullcontext()
        ):
            assert started.start(), "the agent did not start"
        yield started
    finally:
        started.shutdown()
        remove_agent_pod(kube, system, pod)
        clear_namespace(containerd, ctr_ns)


StartStreamAgent = Callable[..., Agent]


@pytest.fixture(scope="module")
def start_stream_agent(
    kube: client.ApiClient,
    containerd: PrivateContainerd,
    places: tuple[str, str],
    stream_address: StreamAddress,
    stream_certs: StreamCerts,
    gateway: GatewayParts,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[StartStreamAgent]:
    """``start(prefix, **settings) -> Agent``: a ``stream_agent`` of the rig behind
    its gateway, with a module's own settings; stopped at the module's end."""
    system, _ = places
    with contextlib.ExitStack() as stack:

        def start(prefix: str, **overrides: Any) -> Agent:
            workdir = tmp_path_factory.mktemp(prefix)
            return stack.enter_context(
                stream_agent(
                    kube,
                    containerd,
                    system,
                    stream_address,
                    stream_certs,
                    workdir,
                    prefix=prefix,
                    **overrides,
                )
            )

        yield start


@pytest.fixture(scope="module")
def agent(start_stream_agent: StartStreamAgent) -> Agent:
    return start_stream_agent(
        "streams",
        # The agent's side of the gateway's 30 s wait (above).
        handshake_timeout=30.0,
        stream_file_max_bytes=120 * 2**20,
        log_interval="0.2s",
    )


def _user_kubeconfig(
    kube: client.ApiClient,
    plane: ControlPlane,
    namespace: str,
    user: str,
    workdir: Path,
) -> Path:
    core: Any = client.CoreV1Api(kube)  # bodies as plain JSON
    core.create_namespaced_service_account(namespace, {"metadata": {"name": user}})
    token = core.create_namespaced_service_account_token(
        user, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    path = workdir / f"{user}.kubeconfig"
    path.write_text(
        yaml.safe_dump(kubeconfig_dict(plane.url, str(plane.ca_file), user, token=token))
    )
    return path


def _grant(
    kube: client.ApiClient,
    namespace: str,
    name: str,
    rules: list[dict[str, Any]],
    subject: tuple[str, str],
) -> None:
    rbac: Any = client.RbacAuthorizationV1Api(kube)  # bodies as plain JSON
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "namespace": subject[0], "name": subject[1]}],
        },
    )


# What the chart's sandlot-edit and sandlot-view grant (templates/tenant-rbac.yaml).
EDIT = [
    {"apiGroups": [GROUP], "resources": ["sandboxes"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [SUBRESOURCE_GROUP],
        "resources": [
            "sandboxes/exec",
            "sandboxes/log",
            "sandboxes/files",
            "sandboxes/portforward",
        ],
        "verbs": ["get", "create", "delete"],
    },
]
VIEW = [
    {"apiGroups": [GROUP], "resources": ["sandboxes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [SUBRESOURCE_GROUP], "resources": ["sandboxes/log"], "verbs": ["get"]},
]
# Passes the API server's own check of the WebSocket's GET, not the gateway's review.
GET_ONLY = [
    {"apiGroups": [GROUP], "resources": ["sandboxes"], "verbs": ["get"]},
    {"apiGroups": [SUBRESOURCE_GROUP], "resources": ["sandboxes/exec"], "verbs": ["get"]},
]


@pytest.fixture(scope="module")
def users(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    places: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Callers in the tenant's namespace: ``operator-person`` (edit), ``onlooker``
    (view), ``half-granted`` (get but not create on sandboxes/exec)."""
    _, tenant = places
    workdir = tmp_path_factory.mktemp("users")
    configs = {}
    for user, rules in (("operator-person", EDIT), ("onlooker", VIEW), ("half-granted", GET_ONLY)):
        configs[user] = _user_kubeconfig(kube, control_plane, tenant, user, workdir)
        _grant(kube, tenant, f"{user}-sandboxes", rules, (tenant, user))
    return configs


def sandlot(
    command: str, *args: str, kubeconfig: Path, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``sandlot COMMAND --kubeconfig FILE ARGS...`` (before any ``--`` of exec)."""
    return subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", command, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def running_sandbox(
    kube: client.ApiClient,
    agent: Agent,
    namespace: str,
    name: str,
    script: str,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from tests.integration.test_agent_node import create_sandbox, wait_phase

    create_sandbox(
        kube,
        namespace,
        name,
        agent.node,
        command=["sh", "-c", script],
        spec=spec,
    )
    sandbox = wait_phase(kube, namespace, name, "Running", timeout=30)
    wait_for(
        lambda: (
            (agent.sandbox_watch.get(f"{namespace}/{name}") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        timeout=10,
        what="the agent's watch to see the sandbox Running",
    )
    return sandbox


def delete_sandbox(kube: client.ApiClient, namespace: str, name: str) -> None:
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )
