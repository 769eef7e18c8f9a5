"""The leader fence's tests' release: the chart's identities, RBAC and leader fence
(``sandlot.api.leaderfence``) applied as rendered, with a leader Lease of the
release's own, and operator replicas as Pod objects of the operator's
ServiceAccount (no kubelet runs them: the Pod is what a replica's token is bound
to, and the API server puts its name into the token's user info)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import RequestCounter, WriteFence, load_api_client
from sandlot.adapters.objects import Leases
from sandlot.api.common import API_VERSION, GROUP, VERSION
from sandlot.api.leaderfence import CHART_TEMPLATE, HOLDER_RULE, leader_fence_policy
from sandlot.api.writepolicy import Identities
from sandlot.devtools.controlplane import ControlPlane, helm_path
from tests.support.chart import Installed, apply, hook_of, render, sa_kubeconfig
from tests.support.kube import Kubectl
from tests.support.wait import wait_for

KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
NODE = "fence-node"


@dataclass
class Release:
    installed: Installed
    ids: Identities
    kube: client.ApiClient
    plane: ControlPlane
    workdir: Path
    tenant: str  # a namespace for Sandboxes

    @property
    def lease(self) -> str:
        return self.ids.leader_lease

    def replica(
        self, pod: str, *, fence: WriteFence | None = None, counter: RequestCounter | None = None
    ) -> client.ApiClient:
        """An API client of the operator replica ``pod``: a token bound to a Pod of
        that name (created at its first client), as the kubelet mounts into the
        operator's container."""
        path = self.workdir / f"{pod}.kubeconfig"
        if not path.exists():
            sa_kubeconfig(self.kube, self.plane, self.installed, "operator", path, pod_name=pod)
        return load_api_client(str(path), fence=fence, counter=counter)

    def hold(self, holder: str | None) -> None:
        """Make ``holder`` the Lease's holder (None: no Lease at all), as a takeover would."""
        leases = Leases(self.kube, self.ids.namespace)
        record = leases.get(self.lease)
        if holder is None:
            if record is not None:
                client.CoordinationV1Api(self.kube).delete_namespaced_lease(
                    self.lease, self.ids.namespace
                )
            return
        now = datetime.now(UTC)
        if record is None:
            leases.create(self.lease, holder=holder, duration_seconds=12, now=now)
        else:
            leases.update(record, holder=holder, duration_seconds=12, renew_time=now)


def message_of(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body)


def refused_with(call: Callable[[], object]) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, message_of(info.value)
    return message_of(info.value)


def make_sandbox(
    kube: client.ApiClient, namespace: str, name: str, phase: str = "Running"
) -> dict[str, Any]:
    objs: Any = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": API_VERSION,
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "sandlot.test/busybox:1", "nodeName": NODE},
    }
    objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", body)
    return dict(
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "sandboxes", name, {"status": {"phase": phase}}
        )
    )


def patch_status(api: client.ApiClient, namespace: str, name: str, status: dict[str, Any]) -> Any:
    return client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", name, {"status": status}
    )


@pytest.fixture(scope="session")
def release(
    kube: client.ApiClient,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart's identities, RBAC and leader fence for a fresh release and Lease,
    once per control plane: on this API server a fence created after another one
    was deleted was seen not to take effect (its writes admitted as if the Lease
    were missing), so both modules share one."""
    suffix = uuid.uuid4().hex[:6]
    name, namespace, lease = f"lf{suffix}", f"lf-{suffix}", f"leader-{suffix}"
    tenant = f"lft-{suffix}"
    core = client.CoreV1Api(kube)
    for ns in (namespace, tenant):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    args = (
        "--set",
        "admissionPolicy.enabled=false,placementPolicy.enabled=false,"
        f"operator.leaderElection.leaseName={lease}",
    )
    docs = [
        d
        for d in render(helm_path(), *args, release=name, namespace=namespace)
        if not hook_of(d) and d["kind"] in KINDS
    ]
    ids = Identities(
        fullname=f"{name}-sandlot",
        namespace=namespace,
        agent_service_account=f"{name}-sandlot-agent",
        operator_service_account=f"{name}-sandlot-operator",
        leader_lease=lease,
    )
    template = CHART_TEMPLATE.removeprefix("charts/sandlot/")
    only = render(helm_path(), *args, "--show-only", template, release=name, namespace=namespace)
    fence = [d for d in only if d["kind"] in POLICY_KINDS]
    assert fence == leader_fence_policy(ids), (
        f"{CHART_TEMPLATE} renders other objects than sandlot.api.leaderfence"
    )
    docs += fence
    apply(kubectl, docs)
    installed = Installed(name, namespace, docs)
    rel = Release(
        installed, ids, kube, control_plane, tmp_path_factory.mktemp("leader-fence"), tenant
    )
    # The fence takes effect once the API server has compiled it: wait for its first refusal.
    rel.hold("nobody-yet")
    make_sandbox(kube, tenant, "probe")
    config = sa_kubeconfig(kube, control_plane, installed, "operator", rel.workdir / "unbound")
    unbound = load_api_client(str(config))

    def refused() -> bool:
        try:
            patch_status(unbound, tenant, "probe", {"reason": "probe"})
        except ApiException as e:
            assert e.status == 403 and "operator-bound-token" in message_of(e), message_of(e)
            return True
        return False

    wait_for(refused, timeout=30, interval=0.3, what="the leader fence to take effect")
    unbound.close()
    yield rel
    kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )
    for ns in (namespace, tenant):
        core.delete_namespace(ns)


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:6]


def admitted_once_seen(api: client.ApiClient, release: Release, name: str) -> Any:
    """The holder's write, once the API server's copy of the Lease names it (it trails
    a change of holder by milliseconds)."""

    def write() -> Any:
        try:
            return patch_status(api, release.tenant, name, {"reason": "held"})
        except ApiException as e:
            if e.status == 403 and HOLDER_RULE in message_of(e):
                return None
            raise

    return wait_for(write, timeout=10, interval=0.05, what="the holder's write to be admitted")
