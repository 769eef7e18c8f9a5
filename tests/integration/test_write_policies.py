"""The write policies (``sandlot.api.writepolicy``) on the real API server.

The chart's ServiceAccounts, RBAC and write policies are applied as rendered. An
agent token comes from a TokenRequest bound to a Pod object on node A (no kubelet
runs it: the Pod is what the token is bound to, and the API server puts its node
into the token's user info); with it, every write the agent makes is tried
against node B's object (refused, the message naming the rule) and against node
A's (allowed). The operator's token tries Services and EndpointSlices with and
without sandlot's managed-by label.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Objects
from sandlot.adapters.workloads import ServiceChanged, get_service, write_service
from sandlot.api.common import API_VERSION, GROUP, VERSION
from sandlot.api.keys import (
    ENDPOINTSLICE_MANAGED_BY_LABEL,
    ENDPOINTSLICE_MANAGER,
    SERVICE_MANAGED_BY_LABEL,
    SERVICE_MANAGER,
)
from sandlot.api.timestamps import rfc3339
from sandlot.api.writepolicy import CHART_TEMPLATE, Identities, write_policies
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.routing import PoolRef, Router, ServiceTaken, desired_service
from sandlot.devtools.controlplane import ControlPlane, helm_path
from tests.support.chart import Installed, apply, hook_of, render, sa_kubeconfig
from tests.support.kube import Kubectl
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@dataclass
class Release:
    installed: Installed
    ids: Identities
    kube: client.ApiClient
    plane: ControlPlane
    workdir: Path

    def api(self, component: str, node: str | None = None) -> client.ApiClient:
        path = self.workdir / f"{component}-{node or 'unbound'}-{uuid.uuid4().hex[:6]}"
        config = sa_kubeconfig(self.kube, self.plane, self.installed, component, path, node)
        return load_api_client(str(config))


@pytest.fixture(scope="module")
def release(
    kube: client.ApiClient,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart's identities, RBAC and write policies for a fresh release. The
    leader Lease gets a name of its own, so the cluster-wide node-name rule never
    touches another test's nodes."""
    suffix = uuid.uuid4().hex[:6]
    name, namespace, lease = f"wp{suffix}", f"wp-{suffix}", f"leader-{suffix}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    # The leader fence has tests of its own (tests/support/leaderfence.py), one per
    # control plane: a fence created after another was deleted does not take effect.
    docs = render(
        helm_path(),
        "--set",
        "admissionPolicy.enabled=false,placementPolicy.enabled=false,"
        f"writePolicies.leaderFence=false,operator.leaderElection.leaseName={lease}",
        release=name,
        namespace=namespace,
    )
    docs = [d for d in docs if not hook_of(d) and d["kind"] in KINDS + POLICY_KINDS]
    ids = Identities(
        fullname=f"{name}-sandlot",
        namespace=namespace,
        agent_service_account=f"{name}-sandlot-agent",
        operator_service_account=f"{name}-sandlot-operator",
        leader_lease=lease,
    )

    def key(doc: dict[str, Any]) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    # The chart's other policies (the agent's node identity) have tests of their own.
    template = CHART_TEMPLATE.removeprefix("charts/sandlot/")
    only = render(
        helm_path(),
        "--set",
        "admissionPolicy.enabled=false,placementPolicy.enabled=false,"
        f"operator.leaderElection.leaseName={lease}",
        "--show-only",
        template,
        release=name,
        namespace=namespace,
    )
    rendered = sorted((d for d in only if d["kind"] in POLICY_KINDS), key=key)
    assert rendered == sorted(write_policies(ids), key=key), (
        f"{CHART_TEMPLATE} renders other objects than sandlot.api.writepolicy"
    )
    apply(kubectl, docs)
    installed = Installed(name, namespace, docs)
    rel = Release(installed, ids, kube, control_plane, tmp_path_factory.mktemp("write-policies"))
    # A policy takes effect once the API server has compiled it: wait for its first refusal.
    probe = rel.api("agent")

    def refused() -> bool:
        try:
            _create_lease(probe, namespace, f"probe-{suffix}", f"probe-{suffix}")
        except ApiException as e:
            return e.status == 403 and "agent-bound-token" in _message(e)
        client.CoordinationV1Api(kube).delete_namespaced_lease(f"probe-{suffix}", namespace)
        return False

    wait_for(refused, timeout=30, interval=0.3, what="the agent write policy to take effect")
    probe.close()
    yield rel
    kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=_dump(docs))


def _dump(docs: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(docs)


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body)


def _refused(call: Callable[[], object], rule: str) -> str:
    with pytest.raises(ApiException) as info:
        call()
    message = _message(info.value)
    assert info.value.status == 403, message
    assert f"rule {rule}:" in message, message
    return message


def _stamp() -> str:
    return rfc3339(datetime.now(UTC))


def _create_lease(api: client.ApiClient, namespace: str, name: str, holder: str) -> Any:
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=60),
    )
    return client.CoordinationV1Api(api).create_namespaced_lease(namespace, body)


def _node(objs: Any, name: str) -> None:
    body = {"apiVersion": API_VERSION, "kind": "SandboxNode", "metadata": {"name": name}}
    objs.create_cluster_custom_object(GROUP, VERSION, "sandboxnodes", body)


@dataclass
class Nodes:
    """Two fresh node names, the admin's API, and an agent API bound to node ``a``."""

    a: str
    b: str
    admin: Any
    agent: Any
    agent_api: client.ApiClient
    namespace: str  # the release's
    tenant: str  # a namespace for Sandboxes


@pytest.fixture
def nodes(release: Release, kube: client.ApiClient, namespace: str) -> Iterator[Nodes]:
    tag = uuid.uuid4().hex[:6]
    a, b = f"na-{tag}", f"nb-{tag}"
    agent_api = release.api("agent", node=a)
    objs: Any = client.CustomObjectsApi(kube)
    yield Nodes(
        a, b, objs, client.CustomObjectsApi(agent_api), agent_api, release.ids.namespace, namespace
    )
    agent_api.close()
    for sb in objs.list_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes")["items"]:
        objs.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", sb["metadata"]["name"]
        )
    for name in (a, b):
        for plural in ("sandboxnodes", "cacheprunes"):
            try:
                objs.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as e:
                if e.status != 404:
                    raise


# ------------------------------------------------------------------------- the agent


def test_agent_token_is_bound_to_its_pod_and_names_its_node(release: Release, nodes: Nodes) -> None:
    auth: Any = client.AuthenticationV1Api(nodes.agent_api)  # the body as plain JSON
    review = auth.create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    extra = review.status.user_info.extra
    assert extra["authentication.kubernetes.io/node-name"] == [nodes.a], extra
    assert review.status.user_info.username == release.ids.agent_user


def test_agent_creates_only_its_own_sandboxnode(nodes: Nodes) -> None:
    message = _refused(lambda: _node(nodes.agent, nodes.b), "agent-own-sandboxnode")
    assert nodes.a in message and nodes.b in message
    _node(nodes.agent, nodes.a)


def test_agent_creates_its_sandboxnode_without_labels(nodes: Nodes) -> None:
    # A node labelling itself to match other tenants' nodeSelector (gpu=true) would
    # draw their sandboxes, secrets and private images.
    body = {
        "apiVersion": API_VERSION,
        "kind": "SandboxNode",
        "metadata": {"name": nodes.a, "labels": {"gpu": "true"}},
    }
    message = _refused(
        lambda: nodes.agent.create_cluster_custom_object(GROUP, VERSION, "sandboxnodes", body),
        "agent-bare-sandboxnode",
    )
    assert "asked for gpu" in message, message
    _node(nodes.agent, nodes.a)
    # Labels are the admins': theirs stand, and no status write of the agent moves them.
    nodes.admin.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", nodes.a, {"metadata": {"labels": {"pool": "cpu"}}}
    )
    nodes.agent.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sandboxnodes",
        nodes.a,
        {"metadata": {"labels": {"gpu": "true"}}, "status": {"address": "10.1.2.3"}},
    )
    got = nodes.admin.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", nodes.a)
    assert got["metadata"]["labels"] == {"pool": "cpu"}, got["metadata"]


def test_agent_writes_only_its_own_sandboxnode_status(nodes: Nodes) -> None:
    _node(nodes.admin, nodes.a)
    _node(nodes.admin, nodes.b)
    body = {"status": {"address": "10.1.2.3", "capacity": {"sandboxes": 3}}}

    def patch(name: str) -> Any:
        return nodes.agent.patch_cluster_custom_object_status(
            GROUP, VERSION, "sandboxnodes", name, body
        )

    _refused(lambda: patch(nodes.b), "agent-own-sandboxnode")
    assert patch(nodes.a)["status"]["address"] == "10.1.2.3"
    got = nodes.admin.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", nodes.b)
    assert "address" not in (got.get("status") or {})


def test_agent_leaves_the_operators_fields_of_its_node_status_alone(nodes: Nodes) -> None:
    _node(nodes.agent, nodes.a)
    operator_status = {
        "phase": "Ready",
        "health": {"unhealthySince": None},
        "conditions": [{"type": "Ready", "status": "True", "reason": "LeaseRenewed"}],
    }
    nodes.admin.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", nodes.a, {"status": operator_status}
    )

    def patch(status: dict[str, Any]) -> Any:
        return nodes.agent.patch_cluster_custom_object_status(
            GROUP, VERSION, "sandboxnodes", nodes.a, {"status": status}
        )

    rule = "agent-node-status-not-operators"
    _refused(lambda: patch({"phase": "NotReady"}), rule)
    _refused(lambda: patch({"health": {"handledAt": _stamp(), "handledCount": 3}}), rule)
    _refused(lambda: patch({"conditions": []}), rule)
    got = patch({"address": "10.1.2.3", "gc": {"recordsRemoved": 1}})
    assert got["status"]["address"] == "10.1.2.3" and got["status"]["phase"] == "Ready"


def test_agent_creates_and_renews_only_its_own_lease(release: Release, nodes: Nodes) -> None:
    ns = nodes.namespace
    leases = client.CoordinationV1Api(nodes.agent_api)
    _refused(lambda: _create_lease(nodes.agent_api, ns, nodes.b, nodes.b), "agent-own-lease")
    _refused(lambda: _create_lease(nodes.agent_api, ns, nodes.a, nodes.b), "agent-own-lease")
    mine = _create_lease(nodes.agent_api, ns, nodes.a, nodes.a)
    mine.spec.renew_time = datetime.now(UTC)
    leases.replace_namespaced_lease(nodes.a, ns, mine)

    admin = client.CoordinationV1Api(release.kube)
    theirs = _create_lease(release.kube, ns, nodes.b, nodes.b)
    theirs.spec.renew_time = datetime.now(UTC)
    _refused(lambda: leases.replace_namespaced_lease(nodes.b, ns, theirs), "agent-own-lease")
    try:
        leader = _create_lease(release.kube, ns, release.ids.leader_lease, "operator-0")
    except ApiException as e:
        assert e.status == 409
        leader = admin.read_namespaced_lease(release.ids.leader_lease, ns)
    leader.spec.holder_identity = nodes.a
    message = _refused(
        lambda: leases.replace_namespaced_lease(release.ids.leader_lease, ns, leader),
        "agent-not-leader-lease",
    )
    assert release.ids.leader_lease in message
    kept = admin.read_namespaced_lease(release.ids.leader_lease, ns).spec
    assert kept is not None and kept.holder_identity == "operator-0"
    for name in (nodes.a, nodes.b):
        admin.delete_namespaced_lease(name, ns)


def _sandbox(nodes: Nodes, name: str, node: str) -> None:
    body = {
        "apiVersion": API_VERSION,
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "sandlot.test/busybox:1", "nodeName": node},
    }
    nodes.admin.create_namespaced_custom_object(GROUP, VERSION, nodes.tenant, "sandboxes", body)


def test_agent_writes_status_only_of_sandboxes_on_its_node(nodes: Nodes) -> None:
    _sandbox(nodes, "on-a", nodes.a)
    _sandbox(nodes, "on-b", nodes.b)
    running = {"status": {"phase": "Running", "startedAt": _stamp()}}

    def patch(name: str, body: dict[str, Any] = running) -> Any:
        return nodes.agent.patch_namespaced_custom_object_status(
            GROUP, VERSION, nodes.tenant, "sandboxes", name, body
        )

    message = _refused(lambda: patch("on-b"), "agent-sandbox-status-on-its-node")
    assert f"spec.nodeName {nodes.b}" in message
    assert patch("on-a")["status"]["phase"] == "Running"
    got = nodes.admin.get_namespaced_custom_object(
        GROUP, VERSION, nodes.tenant, "sandboxes", "on-b"
    )
    assert (got.get("status") or {}).get("phase") != "Running"


def test_agent_writes_status_only_of_snapshots_on_its_node(nodes: Nodes) -> None:
    for name, node in (("snap-a", nodes.a), ("snap-b", nodes.b), ("snap-none", None)):
        spec = {"sandboxName": "src", **({"nodeName": node} if node else {})}
        body = {"apiVersion": API_VERSION, "kind": "SandboxSnapshot", "metadata": {"name": name}}
        nodes.admin.create_namespaced_custom_object(
            GROUP, VERSION, nodes.tenant, "sandboxsnapshots", {**body, "spec": spec}
        )
    ready = {"status": {"phase": "Ready", "imageRef": "sandlot.local/snapshots/x:latest"}}

    def patch(name: str) -> Any:
        return nodes.agent.patch_namespaced_custom_object_status(
            GROUP, VERSION, nodes.tenant, "sandboxsnapshots", name, ready
        )

    try:
        message = _refused(lambda: patch("snap-b"), "agent-snapshot-status-on-its-node")
        assert f"spec.nodeName {nodes.b}" in message
        message = _refused(lambda: patch("snap-none"), "agent-snapshot-status-on-its-node")
        assert "spec.nodeName unset" in message
        assert patch("snap-a")["status"]["phase"] == "Ready"
        # Its spec (the node, the sandbox) is the operator's, even on its own node.
        with pytest.raises(ApiException) as info:
            nodes.agent.patch_namespaced_custom_object(
                GROUP, VERSION, nodes.tenant, "sandboxsnapshots", "snap-a", {"spec": {}}
            )
        assert info.value.status == 403, _message(info.value)
    finally:
        for name in ("snap-a", "snap-b", "snap-none"):
            nodes.admin.delete_namespaced_custom_object(
                GROUP, VERSION, nodes.tenant, "sandboxsnapshots", name
            )


def test_agent_changes_only_its_own_entry_of_a_cacheprune(nodes: Nodes) -> None:
    name = nodes.a  # deleted with the node names by the fixture
    body = {"apiVersion": API_VERSION, "kind": "CachePrune", "metadata": {"name": name}}
    nodes.admin.create_cluster_custom_object(GROUP, VERSION, "cacheprunes", body)
    nodes.admin.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "cacheprunes",
        name,
        {"status": {"phase": "Running", "targets": [nodes.a, nodes.b]}},
    )
    result = {"pass": "forced", "recordsRemoved": 2, "completedAt": _stamp()}

    def patch(status: dict[str, Any]) -> Any:
        return nodes.agent.patch_cluster_custom_object_status(
            GROUP, VERSION, "cacheprunes", name, {"status": status}
        )

    rule = "agent-cacheprune-own-entry"
    _refused(lambda: patch({"results": {nodes.b: result}}), rule)
    _refused(lambda: patch({"results": {nodes.a: result, nodes.b: result}}), rule)
    _refused(lambda: patch({"phase": "Complete", "results": {nodes.a: result}}), rule)
    _refused(lambda: patch({"targets": [nodes.a]}), rule)
    got = patch({"results": {nodes.a: result}})
    assert got["status"]["results"][nodes.a]["recordsRemoved"] == 2
    assert got["status"]["phase"] == "Running" and nodes.b not in got["status"]["results"]


def test_agent_answers_a_cacheprune_whose_status_is_still_empty(nodes: Nodes) -> None:
    """The agent may answer before the operator wrote targets: the status its patch
    creates gets the CRD's defaults, which count as unchanged."""
    name = nodes.a
    body = {"apiVersion": API_VERSION, "kind": "CachePrune", "metadata": {"name": name}}
    nodes.admin.create_cluster_custom_object(GROUP, VERSION, "cacheprunes", body)
    got = nodes.agent.patch_cluster_custom_object_status(
        GROUP, VERSION, "cacheprunes", name, {"status": {"results": {nodes.a: {"pass": "forced"}}}}
    )
    assert got["status"]["results"][nodes.a]["pass"] == "forced"


def _event(nodes: Nodes, kind: str, name: str, host: str, namespace: str) -> Any:
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
        involved_object=client.V1ObjectReference(
            api_version=API_VERSION,
            kind=kind,
            name=name,
            namespace=None if namespace == "default" else namespace,
        ),
        reason="Test",
        message="written by the agent",
        type="Normal",
        source=client.V1EventSource(component="sandlot-agent", host=host),
    )
    return client.CoreV1Api(nodes.agent_api).create_namespaced_event(namespace, event)


def test_agent_posts_events_only_about_its_node(nodes: Nodes) -> None:
    rule = "agent-events-about-its-node"
    _refused(lambda: _event(nodes, "SandboxNode", nodes.b, nodes.a, "default"), rule)
    _refused(lambda: _event(nodes, "Sandbox", "on-b", nodes.b, nodes.tenant), rule)
    _refused(lambda: _event(nodes, "Secret", nodes.a, nodes.a, nodes.tenant), rule)
    _event(nodes, "SandboxNode", nodes.a, nodes.a, "default")
    _event(nodes, "Sandbox", "on-a", nodes.a, nodes.tenant)


def test_agent_token_not_bound_to_a_pod_writes_nothing(release: Release, nodes: Nodes) -> None:
    unbound = release.api("agent")
    try:
        objs: Any = client.CustomObjectsApi(unbound)
        _refused(lambda: _node(objs, nodes.a), "agent-bound-token")
        _refused(
            lambda: _create_lease(unbound, nodes.namespace, nodes.a, nodes.a), "agent-bound-token"
        )
    finally:
        unbound.close()


def test_no_sandboxnode_takes_the_leader_lease_name(
    release: Release, kube: client.ApiClient
) -> None:
    objs: Any = client.CustomObjectsApi(kube)
    message = _refused(lambda: _node(objs, release.ids.leader_lease), "node-name-not-leader-lease")
    assert release.ids.leader_lease in message


# ---------------------------------------------------------------------- the operator


def _service(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}]},
    }


def _slice(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": labels},
        "addressType": "IPv4",
        "endpoints": [],
    }


def test_operator_writes_only_services_labelled_as_sandlots(
    release: Release, kube: client.ApiClient, namespace: str
) -> None:
    api = release.api("operator")
    try:
        core: Any = client.CoreV1Api(api)  # bodies as plain JSON
        admin: Any = client.CoreV1Api(kube)
        ours = {SERVICE_MANAGED_BY_LABEL: SERVICE_MANAGER}
        rule = "operator-managed-services"
        _refused(lambda: core.create_namespaced_service(namespace, _service("plain", {})), rule)
        core.create_namespaced_service(namespace, _service("ours", ours))
        admin.create_namespaced_service(namespace, _service("theirs", {"team": "web"}))

        def relabel(name: str, labels: dict[str, str]) -> Any:
            svc = core.read_namespaced_service(name, namespace)
            svc.metadata.labels = labels
            return core.replace_namespaced_service(name, namespace, svc)

        _refused(lambda: relabel("theirs", {"team": "web", **ours}), rule)
        _refused(lambda: core.delete_namespaced_service("theirs", namespace), rule)
        _refused(lambda: relabel("ours", {}), rule)
        relabel("ours", {**ours, "x": "y"})
        core.delete_namespaced_service("ours", namespace)
        assert admin.read_namespaced_service("theirs", namespace).metadata.labels == {"team": "web"}
    finally:
        api.close()


def test_operator_writes_only_endpointslices_labelled_as_sandlots(
    release: Release, kube: client.ApiClient, namespace: str
) -> None:
    api = release.api("operator")
    try:
        discovery: Any = client.DiscoveryV1Api(api)  # bodies as plain JSON
        admin: Any = client.DiscoveryV1Api(kube)
        ours = {ENDPOINTSLICE_MANAGED_BY_LABEL: ENDPOINTSLICE_MANAGER}
        rule = "operator-managed-endpointslices"
        foreign = {ENDPOINTSLICE_MANAGED_BY_LABEL: "endpointslice-controller.k8s.io"}
        _refused(
            lambda: discovery.create_namespaced_endpoint_slice(namespace, _slice("x", foreign)),
            rule,
        )
        discovery.create_namespaced_endpoint_slice(namespace, _slice("ours", ours))
        admin.create_namespaced_endpoint_slice(namespace, _slice("theirs", foreign))
        _refused(lambda: discovery.delete_namespaced_endpoint_slice("theirs", namespace), rule)
        adopt = {"metadata": {"labels": ours}}
        _refused(
            lambda: discovery.patch_namespaced_endpoint_slice("theirs", namespace, adopt), rule
        )
        discovery.delete_namespaced_endpoint_slice("ours", namespace)
    finally:
        api.close()


# -------------------------------------------- the operator's Service: judged and written at once


@pytest.fixture
def routing(release: Release, kube: client.ApiClient, namespace: str) -> Iterator[Routing]:
    """The operator's Router with the operator's own token, for a pool that exists."""
    body = {
        "apiVersion": API_VERSION,
        "kind": "SandboxPool",
        "metadata": {"name": "web"},
        "spec": {"replicas": 0, "template": {"spec": {"image": "sandlot.test/b:1"}}},
    }
    objs: Any = client.CustomObjectsApi(kube)
    pool = objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxpools", body)
    api = release.api("operator")
    objects = Objects(api)
    yield Routing(
        objects,
        Router(objects, WorkloadMetrics(CollectorRegistry())),
        PoolRef(namespace, "web", pool["metadata"]["uid"], "web", ({"containerPort": 8080},)),
        client.CoreV1Api(kube),
    )
    api.close()


@dataclass
class Routing:
    objects: Objects
    router: Router
    pool: PoolRef
    admin: Any  # a CoreV1Api, given bodies as plain JSON

    def service(self) -> Any:
        return self.admin.read_namespaced_service("web", self.pool.namespace)


def test_a_service_made_after_the_read_is_never_written_over(routing: Routing) -> None:
    ns = routing.pool.namespace
    routing.admin.create_namespaced_service(ns, _service("web", {"team": "web"}))
    with pytest.raises(ServiceChanged):  # the read had found nothing: create only
        write_service(routing.objects, ns, desired_service(routing.pool), None)
    with pytest.raises(ServiceTaken):
        routing.router.sync(routing.pool, [])
    svc = routing.service()
    assert svc.metadata.labels == {"team": "web"} and not svc.metadata.owner_references


def test_a_service_replaced_after_the_read_is_never_written_over(routing: Routing) -> None:
    ns = routing.pool.namespace
    assert routing.router.sync(routing.pool, [])
    seen = get_service(routing.objects, ns, "web")
    assert seen is not None and seen["metadata"]["labels"][SERVICE_MANAGED_BY_LABEL]
    routing.admin.delete_namespaced_service("web", ns)
    routing.admin.create_namespaced_service(ns, _service("web", {"team": "web"}))
    with pytest.raises(ServiceChanged):  # judged the pool's at seen's version: stale now
        write_service(routing.objects, ns, desired_service(routing.pool), seen)
    assert routing.service().metadata.labels == {"team": "web"}


def test_a_changed_service_of_the_pool_is_judged_again_and_written(routing: Routing) -> None:
    ns = routing.pool.namespace
    assert routing.router.sync(routing.pool, [])
    note = {"metadata": {"annotations": {"example.test/note": "kept"}}}
    routing.admin.patch_namespaced_service("web", ns, note)
    two = ({"containerPort": 8080, "name": "http"}, {"containerPort": 9090, "name": "admin"})
    routing.router.sync(replace(routing.pool, ports=two), [])
    svc = routing.service()
    assert sorted(p.port for p in svc.spec.ports) == [8080, 9090]
    assert svc.metadata.annotations["example.test/note"] == "kept"
    routing.router.sync(routing.pool, [])  # a port the pool dropped goes
    assert [p.port for p in routing.service().spec.ports] == [8080]


def test_write_policies_render_only_when_enabled() -> None:
    def names(*args: str) -> set[str]:
        docs = render(helm_path(), *args)
        return {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}

    wanted = {"sl-sandlot-agent-writes", "sl-sandlot-operator-writes", "sl-sandlot-node-names"}
    assert wanted <= names()
    assert not wanted & names("--set", "writePolicies.enabled=false")
