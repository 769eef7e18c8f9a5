"""agent-sandbox's own client against the chart's agent-sandbox face, on a real
cluster (a scenario of e2e/scenarios.py's order, between the pool and the stopped
worker): the program as written for kubernetes-sigs/agent-sandbox, its connection
given sandlot's router and a tenant's token."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from tests.support.wait import wait_for

from e2e.scenarios import SANDBOX_IMAGE, Cluster
from sandlot.api.common import GROUP, VERSION

AGENTS = "e2e-agents"
EXT = ("extensions.agents.x-k8s.io", "v1beta1")


def _tenant_kubeconfig(c: Cluster, namespace: str, name: str, work: Path) -> tuple[Path, str]:
    """A ServiceAccount bound to Kubernetes' own ``edit`` in ``namespace``: its
    kubeconfig and its token."""
    core: Any = client.CoreV1Api(c.api)  # bodies as plain JSON
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac: Any = client.RbacAuthorizationV1Api(c.api)
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{name}-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = yaml.safe_load(c.kubeconfig.read_text())
    config["users"] = [{"name": name, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = name
    path = work / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, str(token)


def agent_sandboxs_client_runs_unchanged(c: Cluster, work: Path) -> None:
    """agent-sandbox's Python client, unmodified, against the chart's agent-sandbox face:
    a template and a warm pool of 2, a sandbox created from it, a command and files
    through the router (the API server, the gateway, the agent) on a tenant's token,
    then terminated and gone. Its objects are removed afterwards."""
    from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
    from k8s_agent_sandbox.sandbox_client import SandboxClient

    from sandlot.adapters.kube import load_api_client
    from sandlot.policy.router import api_url

    c.kubectl("create", "namespace", AGENTS)
    kubeconfig, token = _tenant_kubeconfig(c, AGENTS, "agent-program", work)
    c.objs.create_namespaced_custom_object(*EXT, AGENTS, "sandboxtemplates", {
        "apiVersion": "/".join(EXT), "kind": "SandboxTemplate", "metadata": {"name": "busybox"},
        "spec": {"podTemplate": {"spec": {"containers": [
            {"name": "main", "image": SANDBOX_IMAGE, "command": ["sleep", "100000"]}
        ]}}},
    })  # fmt: skip
    c.objs.create_namespaced_custom_object(*EXT, AGENTS, "sandboxwarmpools", {
        "apiVersion": "/".join(EXT), "kind": "SandboxWarmPool", "metadata": {"name": "warm"},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "busybox"}},
    })  # fmt: skip
    wait_for(
        lambda: (
            c.objs.get_namespaced_custom_object(*EXT, AGENTS, "sandboxwarmpools", "warm")
            .get("status", {})
            .get("readyReplicas")
            == 2
        ),
        timeout=180,
        what="the warm pool's 2 members ready",
        interval=1,
    )
    cluster = yaml.safe_load(c.kubeconfig.read_text())["clusters"][0]["cluster"]
    ca = work / "api-server-ca.crt"
    if "certificate-authority-data" in cluster:
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    else:
        ca.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
    program: Any = SandboxClient(
        connection_config=SandboxDirectConnectionConfig(
            api_url=api_url(cluster["server"], AGENTS),
            extra_headers={"Authorization": f"Bearer {token}"},
            ca_cert=str(ca),
        ),
        api_client=load_api_client(str(kubeconfig)),
    )
    sandbox = program.create_sandbox("warm", namespace=AGENTS, sandbox_ready_timeout=120)
    assert (
        sandbox.commands.run("echo hello from their client").stdout == "hello from their client\n"
    )
    sandbox.files.write("notes/a.txt", b"moved through the router\n")
    assert sandbox.files.read("notes/a.txt") == b"moved through the router\n"
    assert sandbox.files.exists("notes/a.txt")
    name = sandbox.sandbox_id
    sandbox.terminate()

    def gone() -> bool:
        return not c.objs.list_namespaced_custom_object(
            GROUP, VERSION, AGENTS, "sandboxes", field_selector=f"metadata.name={name}"
        )["items"]

    wait_for(gone, timeout=60, what=f"sandbox {name} gone with its claim", interval=1)
    c.objs.delete_namespaced_custom_object(*EXT, AGENTS, "sandboxwarmpools", "warm")
    c.objs.delete_namespaced_custom_object(*EXT, AGENTS, "sandboxtemplates", "busybox")
    wait_for(
        lambda: (
            not c.objs.list_namespaced_custom_object(GROUP, VERSION, AGENTS, "sandboxes")["items"]
        ),
        timeout=120,
        what="the warm pool's members gone with it",
        interval=1,
    )
