"""The chart's objects and RBAC on the real API server: applied (server-side) into
the test control plane, tokens requested for the operator's and the agent's
ServiceAccounts through the TokenRequest API, and what each identity may do and
reaches checked against the API server's own answer."""

from __future__ import annotations

import base64
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from tests.support.chart import (
    Installed,
    apply,
    can_i,
    helm,
    hook_of,
    installed,
    render,
    sa_kubeconfig,
)
from tests.support.kube import Kubectl

__all__ = ["helm", "installed"]  # fixtures

pytestmark = pytest.mark.integration


def test_chart_objects_pass_server_side_validation(installed: Installed, kubectl: Kubectl) -> None:
    # Applied by the fixture; applying again with a server dry run re-validates each one.
    out = apply(kubectl, installed.docs, "--dry-run=server")
    for doc in installed.docs:
        assert f"/{doc['metadata']['name']} serverside-applied" in out, (doc["kind"], out)
    got = kubectl(
        "get", "deploy,ds,sa,svc,pdb,role,rolebinding,cm,secret,networkpolicy", "-n", installed.namespace,
        "-o", "name",
    ).stdout  # fmt: skip
    for doc in installed.docs:
        if doc["metadata"].get("namespace") == installed.namespace:
            assert doc["metadata"]["name"] in got, f"{doc['kind']} {doc['metadata']['name']}"


def test_the_gvisor_installer_passes_validation_and_holds_no_identity(
    installed: Installed, helm: Path, kubectl: Kubectl
) -> None:
    """agent.runtimes.gvisor.install's objects (the installer DaemonSet, its
    NetworkPolicy, the RuntimeClass, the agent reading the fragments) validate on the
    API server; the installer's pod runs without an API token under the namespace's
    default ServiceAccount, which no chart binding names."""
    docs = [
        d
        for d in render(
            helm,
            "--set",
            "agent.runtimes.gvisor.install=true,admissionPolicy.enabled=false,"
            "placementPolicy.enabled=false,writePolicies.leaderFence=false",
            release=installed.release,
            namespace=installed.namespace,
        )
        if not hook_of(d)
        and d["kind"] in {"DaemonSet", "RuntimeClass", "NetworkPolicy"}
        and (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        in {"runtime-gvisor", "agent"}
    ]
    assert {d["kind"] for d in docs} == {"DaemonSet", "RuntimeClass", "NetworkPolicy"}, docs
    out = apply(kubectl, docs, "--dry-run=server")
    for doc in docs:
        assert f"/{doc['metadata']['name']} serverside-applied" in out, (doc["kind"], out)
    (pod,) = [
        d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-runtime-gvisor")
    ]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    bound = {
        (s.get("kind"), s.get("name"))
        for d in installed.docs
        if d["kind"] in {"RoleBinding", "ClusterRoleBinding"}
        for s in d.get("subjects") or []
    }
    assert ("ServiceAccount", "default") not in bound, bound


@pytest.mark.parametrize(
    ("component", "args", "allowed"),
    [
        ("agent", ("patch", "sandboxes.sandlot.dev", "--subresource=status", "-A"), True),
        ("agent", ("delete", "sandboxes.sandlot.dev", "-A"), False),
        ("agent", ("create", "sandboxes.sandlot.dev", "-A"), False),
        ("agent", ("patch", "sandboxes.sandlot.dev", "-A"), False),
        ("agent", ("patch", "sandboxnodes.sandlot.dev"), False),
        ("agent", ("delete", "sandboxnodes.sandlot.dev"), False),
        ("agent", ("get", "secrets", "-A"), False),
        ("agent", ("get", "nodes"), True),
        ("agent", ("list", "nodes"), False),
        ("agent", ("watch", "nodes"), False),
        ("agent", ("patch", "nodes"), False),
        ("agent", ("list", "leases.coordination.k8s.io", "-n", "default"), False),
        ("agent", ("create", "tokenreviews.authentication.k8s.io"), False),
        ("agent", ("create", "subjectaccessreviews.authorization.k8s.io"), False),
        ("operator", ("get", "secrets", "-A"), False),
        ("operator", ("list", "secrets", "-A"), False),
        ("operator", ("watch", "nodes"), True),
        ("operator", ("patch", "nodes"), False),
        ("operator", ("create", "pods", "-A"), False),
        ("operator", ("update", "leases.coordination.k8s.io", "-n", "default"), False),
        ("operator", ("delete", "sandboxnodes.sandlot.dev"), False),
        ("operator", ("create", "endpointslices.discovery.k8s.io", "-A"), True),
    ],
    ids=[
        "agent-writes-sandbox-status",
        "agent-cannot-delete-sandboxes",
        "agent-cannot-create-sandboxes",
        "agent-cannot-change-sandbox-spec",
        "agent-cannot-change-node-spec",
        "agent-cannot-delete-nodes",
        "agent-cannot-read-secrets",
        "agent-reads-its-nodes-taints",
        "agent-cannot-list-nodes",
        "agent-cannot-watch-nodes",
        "agent-cannot-write-nodes",
        "agent-leases-only-in-release-namespace",
        "agent-reviews-no-tokens",
        "agent-reviews-no-access",
        "operator-cannot-read-secrets",
        "operator-cannot-list-secrets",
        "operator-watches-nodes-taints",
        "operator-cannot-write-nodes",
        "operator-cannot-create-pods",
        "operator-leases-only-in-release-namespace",
        "operator-cannot-delete-nodes",
        "operator-routes-pools",
    ],
)
def test_service_accounts_hold_least_privilege(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path: Path,
    component: str,
    args: tuple[str, ...],
    allowed: bool,
) -> None:
    config = sa_kubeconfig(kube, control_plane, installed, component, tmp_path / "kubeconfig")
    assert can_i(config, *args) is allowed, f"{component} can-i {' '.join(args)}"


# Each identity's whole reach, as `kubectl auth can-i --list --as` reports it: a
# verb added to the chart without a reason shows up here. The self-review APIs every
# authenticated user has (system:basic-user) and non-resource URLs are left out.
AGENT_REACH = {
    "certificatesigningrequests.certificates.k8s.io": "create get",
    "sandboxnodes.sandlot.dev": "create get list watch",
    "sandboxnodes.sandlot.dev/status": "patch",
    "sandboxes.sandlot.dev": "get list watch",
    "sandboxes.sandlot.dev/status": "patch",
    "cacheprunes.sandlot.dev": "list watch",
    "cacheprunes.sandlot.dev/status": "patch",
    "sandboxsnapshots.sandlot.dev": "get list watch",
    "sandboxsnapshots.sandlot.dev/status": "patch",
    "namespaces": "get",
    # Its Kubernetes Node's taints, mirrored at registration.
    "nodes": "get",
    # A starting sandbox's RuntimeClass (handler, scheduling, overhead).
    "runtimeclasses.node.k8s.io": "get",
    "events": "create",
    "leases.coordination.k8s.io": "create get update",
    # A token of its node's identity only (agent-identity-policy.yaml refuses others).
    "serviceaccounts/token": "create",
    # No tokenreviews or subjectaccessreviews: the gateway reviews, under its own name.
}
OPERATOR_REACH = {
    "certificatesigningrequests.certificates.k8s.io": "get list watch",
    "certificatesigningrequests.certificates.k8s.io/approval": "update",
    "certificatesigningrequests.certificates.k8s.io/status": "update",
    "signers.certificates.k8s.io": "approve sign",
    "sandboxnodes.sandlot.dev": "get list patch watch",
    "sandboxnodes.sandlot.dev/status": "get patch",
    "sandboxes.sandlot.dev": "create delete get list patch watch",
    "sandboxes.sandlot.dev/status": "get patch",
    "sandboxpools.sandlot.dev": "get list watch",
    "sandboxpools.sandlot.dev/status": "get patch",
    "sandboxpools.sandlot.dev/scale": "get",
    "sandboxpools.sandlot.dev/finalizers": "update",
    "cacheprunes.sandlot.dev": "get list watch",
    "cacheprunes.sandlot.dev/status": "get patch",
    "sandboxsnapshots.sandlot.dev": "get list patch watch",
    "sandboxsnapshots.sandlot.dev/status": "get patch",
    "sandboxclaims.sandlot.dev": "delete get list watch",
    "sandboxclaims.sandlot.dev/status": "get patch",
    # The scheduler: a sandbox's RuntimeClass (handler, scheduling).
    "runtimeclasses.node.k8s.io": "get",
    # The scheduler: the Kubernetes Nodes' taints and labels (no agent writes them).
    "nodes": "list watch",
    "services": "create delete get update",
    "endpointslices.discovery.k8s.io": "create delete list patch",
    "events": "create",
    "customresourcedefinitions.apiextensions.k8s.io": "get list watch",
    "leases.coordination.k8s.io": "create get list update watch",
    # Brokered pull credentials: each node's Secret, identity, Role and RoleBinding;
    # the state keys, deleted with their owner.
    "secrets": "create delete get update",
    "serviceaccounts": "create",
    "roles.rbac.authorization.k8s.io": "create update",
    "rolebindings.rbac.authorization.k8s.io": "create update",
}
ROW = re.compile(r"^(\S+)\s+\[[^]]*\]\s+\[[^]]*\]\s+\[([^]]*)\]\s*$")


def reach(kubectl: Kubectl, user: str, namespace: str) -> dict[str, str]:
    out = kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace).stdout
    verbs: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        match = ROW.match(line)
        if match and not match.group(1).startswith("selfsubject"):
            verbs.setdefault(match.group(1), set()).update(match.group(2).split())
    return {resource: " ".join(sorted(v)) for resource, v in verbs.items()}


@pytest.mark.parametrize(
    ("component", "wanted"),
    [("agent", AGENT_REACH), ("operator", OPERATOR_REACH)],
    ids=["agent", "operator"],
)
def test_each_identity_reaches_exactly_what_the_chart_says(
    installed: Installed, kubectl: Kubectl, component: str, wanted: dict[str, str]
) -> None:
    user = f"system:serviceaccount:{installed.namespace}:{installed.service_account(component)}"
    assert reach(kubectl, user, installed.namespace) == wanted
    # Elsewhere only the cluster-wide part: no Lease outside the release namespace.
    elsewhere = reach(kubectl, user, "default")
    assert "leases.coordination.k8s.io" not in elsewhere, elsewhere


def test_agent_mirrors_its_nodes_taints_with_its_service_account_only(
    installed: Installed, kube: client.ApiClient, control_plane: ControlPlane, tmp_path: Path
) -> None:
    from sandlot.agent.capacity import mirrored_taints

    node = f"cp-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(kube)  # bodies as plain JSON
    taint = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
    core.create_node({"metadata": {"name": node}, "spec": {"taints": [taint]}})
    config = sa_kubeconfig(
        kube, control_plane, installed, "agent", tmp_path / "agent.kubeconfig", node=node
    )
    agent_api = load_api_client(str(config))
    try:
        assert mirrored_taints(agent_api, node) == {"nodeTaints": [{**taint, "value": ""}]}, (
            "the chart's agent identity cannot read its Kubernetes Node"
        )
    finally:
        agent_api.close()
        core.delete_node(node)


def test_operator_brokers_pull_credentials_with_its_service_account_only(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The broker reads a node's Secret before it rewrites it: with the chart's RBAC
    alone it creates, re-reads, and rewrites it, and reads no Secret beyond that."""
    from sandlot.adapters.objects import Objects
    from sandlot.adapters.pullsecrets import brokered_data, brokered_key
    from sandlot.controllers.pullcredentials import broker_node

    core: Any = client.CoreV1Api(kube)  # bodies as plain JSON
    rbac: Any = client.RbacAuthorizationV1Api(kube)
    # The tenant namespace's admin lets the operator read its pull secrets.
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "sandlot-pull-secrets"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{installed.release}-sandlot-pull-secrets",
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": installed.service_account("operator"),
                    "namespace": installed.namespace,
                }
            ],
        },
    )
    for name in ("cred-1", "cred-2"):
        document = base64.b64encode(json.dumps({"auths": {"reg.io": {}}, "n": name}).encode())
        core.create_namespaced_secret(
            namespace,
            {
                "metadata": {"name": name},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": document.decode()},
            },
        )
    node = f"n-{uuid.uuid4().hex[:6]}"
    objs: Any = client.CustomObjectsApi(kube)

    def sandbox(name: str, secret: str) -> None:
        objs.create_namespaced_custom_object(
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

    config = sa_kubeconfig(kube, control_plane, installed, "operator", tmp_path / "op.kubeconfig")
    operator_api = load_api_client(str(config))
    try:
        objects = Objects(operator_api)
        sandbox("first", "cred-1")
        assert broker_node(objects, installed.namespace, node)
        assert not broker_node(objects, installed.namespace, node), "unchanged, yet rewritten"
        sandbox("second", "cred-2")
        assert broker_node(objects, installed.namespace, node)
        stored = brokered_data(kube, installed.namespace, node) or {}
        assert set(stored) == {brokered_key(namespace, "cred-1"), brokered_key(namespace, "cred-2")}
    finally:
        operator_api.close()
    # Secrets elsewhere stay out of its reach: the grant is `get` in its own namespace.
    for args in (
        ("get", "secrets", "-n", installed.namespace),
        ("list", "secrets", "-n", installed.namespace),
        ("watch", "secrets", "-n", installed.namespace),
        ("get", "secrets", "-n", "default"),
    ):
        assert can_i(config, *args) is (args[0] == "get" and args[3] == installed.namespace), args


def test_operator_brokers_env_references_in_opted_in_namespaces_only(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    """With the chart's RBAC alone the operator reads the Secret and ConfigMap a
    sandbox's environment references in a namespace that opted in (the pull-secrets
    ClusterRole), and in one that did not it reads nothing: the reference is missing."""
    from sandlot.adapters.objects import Objects
    from sandlot.adapters.pullsecrets import brokered_data, reference_key
    from sandlot.controllers.pullcredentials import broker_node
    from sandlot.policy.envrefs import Referenced, decode

    core: Any = client.CoreV1Api(kube)  # bodies as plain JSON
    rbac: Any = client.RbacAuthorizationV1Api(kube)
    closed = f"closed-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": closed}})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "sandlot-pull-secrets"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{installed.release}-sandlot-pull-secrets",
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": installed.service_account("operator"),
                    "namespace": installed.namespace,
                }
            ],
        },
    )
    node = f"n-{uuid.uuid4().hex[:6]}"
    env = [
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}},
    ]
    for ns in (namespace, closed):
        core.create_namespaced_secret(
            ns, {"metadata": {"name": "db"}, "stringData": {"pw": "p", "unused": "u"}}
        )
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": "cfg"}, "data": {"level": "debug"}}
        )
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": "app"},
                "spec": {"image": "reg.io/a:1", "nodeName": node, "env": env},
            },
        )
    config = sa_kubeconfig(kube, control_plane, installed, "operator", tmp_path / "op.kubeconfig")
    operator_api = load_api_client(str(config))
    try:
        assert broker_node(Objects(operator_api), installed.namespace, node)
    finally:
        operator_api.close()
        core.delete_namespace(closed)
    stored = brokered_data(kube, installed.namespace, node) or {}
    read = {key: decode(value) for key, value in stored.items()}
    assert read == {
        reference_key(namespace, "secret", "db"): Referenced(True, {"pw": "p"}),
        reference_key(namespace, "configmap", "cfg"): Referenced(True, {"level": "debug"}),
        reference_key(closed, "secret", "db"): Referenced(False),
        reference_key(closed, "configmap", "cfg"): Referenced(False),
    }
