"""kubernetes-sigs/agent-sandbox's own Python client (``k8s-agent-sandbox`` 1.0.8,
unmodified) against sandlot: a real operator serving agent-sandbox's objects, the
real API server, the gateway's router and a real agent running real containers.

The user changes three lines of their program: the client is given
``SandboxDirectConnectionConfig(api_url=<sandlot router-url>, extra_headers=
{"Authorization": ...}, ca_cert=<the API server's CA>)`` and a Kubernetes client of
their own credentials; everything else is the program as written for agent-sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.policy.router import api_url
from tests.support.kube import agent_sandbox_crds
from tests.support.router import agent, gateway, router_users, user_of
from tests.support.streams import IMAGE
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]
__all__ = ["agent", "gateway", "router_users"]  # fixtures

agent_sandbox = pytest.importorskip(
    "k8s_agent_sandbox", reason="k8s-agent-sandbox (the dev lock's) is not installed"
)
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig  # noqa: E402

EXT = ("extensions.agents.x-k8s.io", "v1beta1")
# The module's agent's node, labelled by an admin: the pool's members go there, not to
# a node an earlier module's agent left behind with its lease not yet expired.
NODE_LABEL = "test.sandlot.dev/compat-node"


def _objects(kube: client.ApiClient, tenant: str, replicas: int, node: str) -> None:
    objs: Any = client.CustomObjectsApi(kube)
    objs.create_namespaced_custom_object(
        *EXT,
        tenant,
        "sandboxtemplates",
        {
            "apiVersion": "/".join(EXT),
            "kind": "SandboxTemplate",
            "metadata": {"name": "python"},
            "spec": {
                "podTemplate": {
                    "spec": {
                        "containers": [
                            {"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}
                        ],
                        "terminationGracePeriodSeconds": 1,
                        "nodeSelector": {NODE_LABEL: node},
                    }
                },
                "envVarsInjectionPolicy": "Allowed",
            },
        },
    )
    objs.create_namespaced_custom_object(
        *EXT,
        tenant,
        "sandboxwarmpools",
        {
            "apiVersion": "/".join(EXT),
            "kind": "SandboxWarmPool",
            "metadata": {"name": "python-pool"},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "python"}},
        },
    )


@pytest.fixture(scope="module")
def served(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    control_plane: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    """agent-sandbox's CRDs, an operator serving them (its namespace the rig's, where
    the agent heartbeats), and a warm pool of 3 Running on the rig's agent."""
    from tests.support.operator import OperatorProcess

    system, tenant = places
    crds = contextlib.ExitStack()
    crds.enter_context(agent_sandbox_crds(kube))
    op = OperatorProcess(
        control_plane,
        tmp_path_factory.mktemp("operator"),
        system,
        "--agent-sandbox",
        "--resync-interval",
        "1s",
    )
    try:
        op.wait_metrics()
        wait_for(op.is_leader, timeout=30, what="the operator to lead")
        client.CustomObjectsApi(kube).patch_cluster_custom_object(
            GROUP,
            VERSION,
            "sandboxnodes",
            agent.node,
            {"metadata": {"labels": {NODE_LABEL: agent.node}}},
        )
        _objects(kube, tenant, 3, agent.node)
        objs: Any = client.CustomObjectsApi(kube)
        wait_for(
            lambda: (
                objs.get_namespaced_custom_object(*EXT, tenant, "sandboxwarmpools", "python-pool")
                .get("status", {})
                .get("readyReplicas")
                == 3
            ),
            timeout=60,
            what="the warm pool's 3 members Running",
        )
        yield op
    finally:
        op.stop()
        crds.close()


def _config(kubeconfig: Path, tenant: str) -> tuple[SandboxDirectConnectionConfig, str]:
    server, ca, token = user_of(kubeconfig)
    # The three lines a user changes:
    return SandboxDirectConnectionConfig(
        api_url=api_url(server, tenant),
        extra_headers={"Authorization": f"Bearer {token}"},
        ca_cert=ca,
    ), str(kubeconfig)


def _gone(kube: client.ApiClient, tenant: str, name: str) -> bool:
    objs: Any = client.CustomObjectsApi(kube)
    found = objs.list_namespaced_custom_object(
        GROUP, VERSION, tenant, "sandboxes", field_selector=f"metadata.name={name}"
    )["items"]
    return not found


def test_their_client_unmodified_runs_on_sandlot(
    kube: client.ApiClient,
    served: Any,
    places: tuple[str, str],
    router_users: dict[str, Path],
) -> None:
    from k8s_agent_sandbox.exceptions import SandboxWarmPoolNotFoundError
    from k8s_agent_sandbox.sandbox_client import SandboxClient

    _, tenant = places
    config, kubeconfig = _config(router_users["operator-person"], tenant)
    user_api = load_api_client(kubeconfig)
    sandboxes: Any = SandboxClient(connection_config=config, api_client=user_api)

    sandbox = sandboxes.create_sandbox("python-pool", namespace=tenant, sandbox_ready_timeout=60)
    assert sandbox.claim_name.startswith("sandbox-claim-")
    result = sandbox.commands.run("echo hello; echo oops >&2; exit 4")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 4)

    sandbox.files.write("work/notes.txt", b"written by their client\n")
    assert sandbox.files.read("work/notes.txt") == b"written by their client\n"
    assert sandbox.commands.run("cat work/notes.txt").stdout == "written by their client\n"
    assert [e.name for e in sandbox.files.list("work")] == ["notes.txt"]
    assert sandbox.files.exists("work/notes.txt") and not sandbox.files.exists("nope")
    assert sandbox.status()[0] == "SandboxReady"

    again = sandboxes.get_sandbox(sandbox.claim_name, namespace=tenant)
    assert again.sandbox_id == sandbox.sandbox_id
    assert (tenant, sandbox.claim_name) in sandboxes.list_active_sandboxes()

    name = sandbox.sandbox_id
    sandbox.terminate()
    wait_for(lambda: _gone(kube, tenant, name), timeout=60, what=f"sandbox {name} gone")

    with pytest.raises(SandboxWarmPoolNotFoundError):
        sandboxes.create_sandbox("no-such-pool", namespace=tenant, sandbox_ready_timeout=30)

    short = sandboxes.create_sandbox(
        "python-pool", namespace=tenant, sandbox_ready_timeout=60, shutdown_after_seconds=3
    )
    short_name = short.sandbox_id
    wait_for(
        lambda: _gone(kube, tenant, short_name),
        timeout=60,
        what=f"sandbox {short_name} gone at its claim's shutdownTime",
    )
    objs: Any = client.CustomObjectsApi(kube)
    claims = objs.list_namespaced_custom_object(*EXT, tenant, "sandboxclaims")["items"]
    assert short.claim_name not in {c["metadata"]["name"] for c in claims}


def test_claim_env_reaches_every_command_and_the_async_client_works(
    kube: client.ApiClient,
    served: Any,
    places: tuple[str, str],
    router_users: dict[str, Path],
) -> None:
    from k8s_agent_sandbox.async_sandbox_client import AsyncSandboxClient
    from k8s_agent_sandbox.sandbox_client import SandboxClient
    from kubernetes_asyncio import config as async_config

    _, tenant = places
    config, kubeconfig = _config(router_users["operator-person"], tenant)
    sandboxes: Any = SandboxClient(connection_config=config, api_client=load_api_client(kubeconfig))
    sandbox = sandboxes.create_sandbox(
        "python-pool", namespace=tenant, sandbox_ready_timeout=60, env={"GREETING": "warm"}
    )
    try:
        assert sandbox.commands.run("echo $GREETING").stdout == "warm\n"
    finally:
        sandbox.terminate()

    async def main() -> str:
        api = await async_config.new_client_from_config(config_file=kubeconfig)
        try:
            aclient: Any
            async with AsyncSandboxClient(connection_config=config, api_client=api) as aclient:
                sb = await aclient.create_sandbox(
                    "python-pool", namespace=tenant, sandbox_ready_timeout=60
                )
                out = (await sb.commands.run("echo async")).stdout
                await sb.terminate()
                return str(out)
        finally:
            await api.close()

    assert asyncio.run(main()) == "async\n"
