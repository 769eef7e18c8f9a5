"""The Helm chart in tests: render it, apply what it renders, and act as the
identities it creates (tokens from the TokenRequest API, optionally bound to a
Pod on a node, as a DaemonSet's pod token is)."""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from sandlot.devtools.controlplane import ControlPlane, kubeconfig_dict, kubectl_path
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
    core = client.CoreV1Api(kube)
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
