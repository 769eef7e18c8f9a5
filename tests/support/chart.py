"""The Helm chart in tests: render it, apply what it renders, and act as the
identities it creates (tokens from the TokenRequest API, optionally bound to a
Pod on a node, as a DaemonSet's pod token is).

Fixtures, imported by name into a test module: ``helm`` (session), the helm
binary; ``installed`` (module), the chart's objects in a release namespace of
the module's own."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sandlot.devtools.controlplane import (
    ControlPlane,
    helm_path,
    kubeconfig_dict,
    kubectl_path,
)
from tests.support.kube import Kubectl, repo_root

CHART = repo_root() / "charts" / "sandlot"


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def render(helm: Path, *args: str, release: str = "sl", namespace: str = "sandlot-system"):
    out = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def hook_of(doc: dict[str, Any]) -> str | None:
    """The doc's helm hook (pre-delete, ...); None for what `helm install` creates."""
    return ((doc["metadata"].get("annotations") or {}).get("helm.sh/hook")) or None


def apply(kubectl: Kubectl, docs: list[dict[str, Any]], *extra: str) -> str:
    stream = yaml.safe_dump_all(docs)
    return kubectl(
        "apply", "--server-side", "--field-manager=helm", *extra, "-f", "-", stdin=stream
    ).stdout


@dataclass
class Installed:
    release: str
    namespace: str
    docs: list[dict[str, Any]]

    def service_account(self, component: str) -> str:
        return f"{self.release}-sandlot-{component}"


def sa_token(
    kube: client.ApiClient,
    installed: Installed,
    component: str,
    node: str | None = None,
    pod_name: str | None = None,
) -> str:
    """A token the API server issued for the component's ServiceAccount; with ``node``
    or ``pod_name``, bound to a Pod of that ServiceAccount (on that node, of that
    name): no kubelet runs it, the Pod object is what the token is bound to, and
    what puts the node and the pod's name into it."""
    name = installed.service_account(component)
    core: Any = client.CoreV1Api(kube)  # the Pod's body as plain JSON
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    if node is not None or pod_name is not None:
        pod_spec: dict[str, Any] = {
            "serviceAccountName": name,
            "automountServiceAccountToken": False,
            "containers": [{"name": component, "image": "sandlot.test/none:1"}],
        }
        if node is not None:
            pod_spec["nodeName"] = node
        pod = core.create_namespaced_pod(
            installed.namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_name or f"{component}-{node}-{uuid.uuid4().hex[:6]}"[:63]},
                "spec": pod_spec,
            },
        )
        spec.bound_object_ref = client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
        )
    request = client.AuthenticationV1TokenRequest(spec=spec)
    return str(
        core.create_namespaced_service_account_token(
            name, installed.namespace, request
        ).status.token
    )


def sa_kubeconfig(
    kube: client.ApiClient,
    plane: ControlPlane,
    installed: Installed,
    component: str,
    path: Path,
    node: str | None = None,
    pod_name: str | None = None,
) -> Path:
    """A kubeconfig holding ``sa_token(...)``."""
    token = sa_token(kube, installed, component, node, pod_name)
    user = f"system:serviceaccount:{installed.namespace}:{installed.service_account(component)}"
    path.write_text(
        yaml.safe_dump(kubeconfig_dict(plane.url, str(plane.ca_file), user, token=token))
    )
    path.chmod(0o600)
    return path


def operator_replica(
    kube: client.ApiClient, plane: ControlPlane, installed: Installed, workdir: Path
) -> tuple[Path, str]:
    """A kubeconfig and a leader-election identity for an operator replica as the
    chart runs one: its token bound to its pod, its identity that pod's name (the
    leader fence admits only the pod the leader Lease names)."""
    identity = f"op-{uuid.uuid4().hex[:6]}"
    path = workdir / f"{identity}.kubeconfig"
    return sa_kubeconfig(kube, plane, installed, "operator", path, pod_name=identity), identity


def can_i(kubeconfig: Path, *args: str) -> bool:
    proc = subprocess.run(
        [str(kubectl_path()), "--kubeconfig", str(kubeconfig), "auth", "can-i", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_path()


@pytest.fixture(scope="module")
def installed(helm: Path, kube: client.ApiClient, kubectl: Kubectl) -> Iterator[Installed]:
    """The chart's objects (defaults plus the dashboard) in a fresh release namespace."""
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"sl{suffix}", f"sandlot-{suffix}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    # The sandbox admission policy is cluster-wide: installed here it would refuse the
    # hostNetwork and privileged sandboxes other tests on this control plane create.
    # tests/integration/test_isolation_policy.py installs the same objects (drift-tested
    # against the template) and exercises them; the placement policy, cluster-wide
    # too, has tests/integration/test_placement_admission.py. The write policies
    # stay: they bind only this release's identities (and SandboxNodes named like
    # its leader Lease); its operator runs as the chart runs it (``operator_replica``).
    # The leader fence has tests of its own (tests/support/leaderfence.py): on this
    # API server a fence created after another was deleted does not take effect, so
    # only one is ever created per control plane.
    docs = render(
        helm,
        "--set",
        "grafanaDashboard.enabled=true,admissionPolicy.enabled=false,placementPolicy.enabled=false,"
        "writePolicies.leaderFence=false",
        release=release,
        namespace=namespace,
    )
    docs = [d for d in docs if not hook_of(d)]  # helm creates hooks only when they run
    # The APIService is cluster-wide too, and with no gateway running here it would
    # stay unavailable, which stalls every namespace deletion on this control plane;
    # tests/integration/test_streams.py serves the same group through a real gateway.
    docs = [d for d in docs if d["kind"] != "APIService"]
    apply(kubectl, docs)
    yield Installed(release, namespace, docs)
    # Cluster-scoped objects (RBAC, admission policies) outlive the namespace: delete
    # every rendered object by name.
    kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )
    core.delete_namespace(namespace)
