"""Pull credentials brokered per node, against the real API server and its RBAC: the
operator copies each node's sandboxes' pull secrets into that node's Secret, and
node A's agent identity can read its own Secret but not node B's, nor any tenant's.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects
from sandlot.adapters.pullsecrets import (
    brokered_key,
    brokered_secret_name,
    node_identity,
    read_brokered,
    write_brokered,
)
from sandlot.api.common import GROUP, VERSION
from sandlot.controllers.pullcredentials import broker_node
from sandlot.devtools.controlplane import ControlPlane, helm_path
from tests.support.kube import as_node_identity
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration]


def _dockerconfig(host: str, user: str) -> bytes:
    auth = base64.b64encode(f"{user}:pw".encode()).decode()
    return json.dumps({"auths": {host: {"auth": auth}}}).encode()


def _pull_secret(kube: client.ApiClient, namespace: str, name: str, user: str) -> None:
    client.CoreV1Api(kube).create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=name),
            type="kubernetes.io/dockerconfigjson",
            data={".dockerconfigjson": base64.b64encode(_dockerconfig("reg.io", user)).decode()},
        ),
    )


def _sandbox(kube: client.ApiClient, namespace: str, name: str, node: str, secret: str) -> None:
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {
                "image": "reg.io/a:1",
                "nodeName": node,
                "imagePullSecrets": [{"name": secret}],
            },
        },
    )


@pytest.fixture
def system_ns(kube: client.ApiClient) -> Iterator[str]:
    name = f"sys-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def test_node_identity_reads_only_its_own_brokered_credentials(
    kube: client.ApiClient, control_plane: ControlPlane, namespace: str, system_ns: str
) -> None:
    node_a, node_b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    _pull_secret(kube, namespace, "cred-a", "user-a")
    _pull_secret(kube, namespace, "cred-b", "user-b")
    _pull_secret(kube, namespace, "cred-unused", "user-c")
    _sandbox(kube, namespace, "on-a", node_a, "cred-a")
    _sandbox(kube, namespace, "on-b", node_b, "cred-b")
    objects = Objects(kube)

    assert broker_node(objects, system_ns, node_a)
    assert broker_node(objects, system_ns, node_b)
    assert not broker_node(objects, system_ns, node_a), "an unchanged node is rewritten"

    as_a = as_node_identity(kube, control_plane, system_ns, node_a)
    try:
        own = read_brokered(as_a, system_ns, node_a)
        assert own is not None and set(own) == {brokered_key(namespace, "cred-a")}
        assert json.loads(base64.b64decode(own[brokered_key(namespace, "cred-a")])) == json.loads(
            _dockerconfig("reg.io", "user-a")
        )
        core = client.CoreV1Api(as_a)
        for read in (
            lambda: core.read_namespaced_secret(brokered_secret_name(node_b), system_ns),
            lambda: core.read_namespaced_secret("cred-a", namespace),
            lambda: core.list_namespaced_secret(system_ns),
            lambda: core.list_secret_for_all_namespaces(),
        ):
            with pytest.raises(ApiException) as refused:
                read()
            assert refused.value.status == 403
        # What the agent's reader makes of a Secret it may not read: nothing.
        assert read_brokered(as_a, system_ns, node_b) is None
    finally:
        as_a.close()


def test_a_terminal_sandbox_no_longer_brings_its_credential(
    kube: client.ApiClient, namespace: str, system_ns: str
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    _pull_secret(kube, namespace, "cred", "user")
    _sandbox(kube, namespace, "done", node, "cred")
    objects = Objects(kube)
    broker_node(objects, system_ns, node)
    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "done", {"status": {"phase": "Failed"}}
    )

    assert broker_node(objects, system_ns, node)

    assert read_brokered(kube, system_ns, node) == {}


def _render_identity_policy(namespace: str) -> list[dict[str, Any]]:
    chart = Path(__file__).resolve().parents[2] / "charts" / "sandlot"
    proc = subprocess.run(
        [
            str(helm_path()),
            "template",
            "sl",
            str(chart),
            "--namespace",
            namespace,
            "--show-only",
            "templates/agent-identity-policy.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _token(kube: client.ApiClient, namespace: str, account: str, pod: Any = None) -> str:
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    if pod is not None:
        spec.bound_object_ref = client.V1BoundObjectReference(
            kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
        )
    request = client.AuthenticationV1TokenRequest(spec=spec)
    issued = client.CoreV1Api(kube).create_namespaced_service_account_token(
        account, namespace, request
    )
    assert issued.status is not None, f"no token issued for {account}"
    return str(issued.status.token)


def _client(plane: ControlPlane, token: str) -> client.ApiClient:
    config = client.Configuration(host=plane.url)
    config.ssl_ca_cert = str(plane.ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(config)


def test_an_agent_gets_the_token_of_its_own_node_identity_only(
    kube: client.ApiClient, control_plane: ControlPlane, system_ns: str
) -> None:
    """The chart's policy against the real API server: an agent pod's token (bound to
    its pod, carrying its node's name) is exchanged for its node's identity, and the
    same request for another node's identity is refused."""
    node_a, node_b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    admission: Any = client.AdmissionregistrationV1Api(kube)  # bodies as plain JSON
    docs = _render_identity_policy(system_ns)
    policy, binding = docs[0], docs[1]
    agent_sa = "sl-sandlot-agent"
    core.create_namespaced_service_account(
        system_ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=agent_sa))
    )
    rbac.create_namespaced_role(
        system_ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="agent-token"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[""], resources=["serviceaccounts/token"], verbs=["create"]
                )
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        system_ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="agent-token"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="agent-token"
            ),
            subjects=[
                client.RbacV1Subject(kind="ServiceAccount", name=agent_sa, namespace=system_ns)
            ],
        ),
    )
    for node in (node_a, node_b):
        write_brokered(kube, system_ns, node, {})
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node_a)))
    pod = core.create_namespaced_pod(
        system_ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="agent-on-a"),
            spec=client.V1PodSpec(
                service_account_name=agent_sa,
                node_name=node_a,
                containers=[client.V1Container(name="agent", image="sandlot/agent:test")],
            ),
        ),
    )
    name = policy["metadata"]["name"]
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    as_agent = _client(control_plane, _token(kube, system_ns, agent_sa, pod))
    try:

        def refused_for_b() -> str | None:
            try:
                _token(as_agent, system_ns, node_identity(node_b))
            except ApiException as exc:
                return exc.body if exc.status == 403 and "own node" in (exc.body or "") else None
            return None

        # The policy takes effect when the API server has loaded it.
        refusal = wait_for(refused_for_b, timeout=30, what="a token of node B's identity refused")
        assert "own node's identity" in refusal
        own = _client(control_plane, _token(as_agent, system_ns, node_identity(node_a)))
        try:
            assert read_brokered(own, system_ns, node_a) == {}
        finally:
            own.close()
    finally:
        as_agent.close()
        admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        admission.delete_validating_admission_policy(name)
        core.delete_node(node_a)


def test_running_operator_brokers_a_new_sandboxs_secret_to_its_node(
    kube: client.ApiClient, namespace: str, lease_namespace: str, operators: Any
) -> None:
    operators("--resync-interval", "2s")
    node = f"n-{uuid.uuid4().hex[:6]}"
    _pull_secret(kube, namespace, "regcred", "tenant")
    _sandbox(kube, namespace, "wants-cred", node, "regcred")

    data = wait_for(
        lambda: read_brokered(kube, lease_namespace, node),
        timeout=60,
        what=f"the operator to broker {namespace}/regcred to node {node}",
    )

    assert set(data) == {brokered_key(namespace, "regcred")}
