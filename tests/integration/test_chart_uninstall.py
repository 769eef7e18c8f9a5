"""The chart's uninstall hooks: the pre-delete and post-delete Jobs and their RBAC,
applied into the real API server, purge with exactly their own rights."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from sandlot.cli.main import main as sandlot_main
from sandlot.devtools.controlplane import ControlPlane
from tests.support.chart import (
    Installed,
    apply,
    by_kind,
    can_i,
    helm,
    hook_of,
    render,
    sa_kubeconfig,
)
from tests.support.kube import Kubectl
from tests.support.operator import Fleet, wipe_nodes

__all__ = ["helm"]  # fixtures

pytestmark = pytest.mark.integration


HOOK_ANNOTATIONS = ("helm.sh/hook", "helm.sh/hook-weight", "helm.sh/hook-delete-policy")


def test_uninstall_hooks_purge_with_exactly_their_own_rbac(
    helm: Path,
    kube: client.ApiClient,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    fleet: Fleet,
    lease_namespace: str,
    tmp_path: Path,
) -> None:
    """The pre-delete and post-delete Jobs, and their RBAC applied into the real API
    server: `sandlot purge` with each hook's token removes objects of all four kinds
    (a verb the chart forgot is a 403, raised out of purge) and can do nothing else."""
    release = f"sl{uuid.uuid4().hex[:6]}"
    docs = render(helm, release=release, namespace=lease_namespace)
    hooks = [d for d in docs if hook_of(d)]
    (deploy,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-operator")
    ]
    operator_pod = deploy["spec"]["template"]["spec"]
    jobs = {hook_of(j): j for j in by_kind(hooks, "Job")}
    assert set(jobs) == {"pre-delete", "post-delete"}
    for phase, job in jobs.items():
        notes = job["metadata"]["annotations"]
        assert notes["helm.sh/hook-delete-policy"] == (
            "before-hook-creation,hook-succeeded,hook-failed"
        ), "a failed hook Job must not linger into the next install"
        assert job["spec"]["activeDeadlineSeconds"] == 180 and job["spec"]["backoffLimit"] == 1
        pod = job["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["args"] == [
            "purge",
            "--workloads" if phase == "pre-delete" else "--nodes",
            "--yes",
            "--wait",
            "120s",
        ]
        assert c["image"] == operator_pod["containers"][0]["image"]
        assert c["securityContext"] == operator_pod["containers"][0]["securityContext"]
        assert pod["securityContext"] == operator_pod["securityContext"]
        assert pod["serviceAccountName"] == f"{release}-sandlot-{phase}"
        own = [d for d in hooks if hook_of(d) == phase and d["kind"] != "Job"]
        assert sorted(d["kind"] for d in own) == [
            "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount",
        ]  # fmt: skip
        for d in own:  # created before the Job, gone with it
            assert int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
                notes["helm.sh/hook-weight"]
            )
            assert all(a in d["metadata"]["annotations"] for a in HOOK_ANNOTATIONS)
    assert not hook_of(deploy)
    off = render(helm, "--set", "cleanupOnUninstall.enabled=false")
    assert not [d for d in off if hook_of(d)]

    rbac = [d for d in hooks if d["kind"] != "Job"]
    apply(kubectl, rbac)
    installed = Installed(release, lease_namespace, rbac)
    try:
        pre = sa_kubeconfig(kube, control_plane, installed, "pre-delete", tmp_path / "pre")
        post = sa_kubeconfig(kube, control_plane, installed, "post-delete", tmp_path / "post")
        for config, args, allowed in (
            (pre, ("delete", "sandboxes.sandlot.dev", "-A"), True),
            (pre, ("delete", "sandboxnodes.sandlot.dev"), False),
            (pre, ("patch", "sandboxes.sandlot.dev", "-A"), False),
            (pre, ("get", "secrets", "-A"), False),
            (pre, ("delete", "leases.coordination.k8s.io", "-n", lease_namespace), False),
            (post, ("delete", "sandboxnodes.sandlot.dev"), True),
            (post, ("delete", "sandboxes.sandlot.dev", "-A"), False),
            (post, ("deletecollection", "sandboxnodes.sandlot.dev"), False),
            (post, ("delete", "leases.coordination.k8s.io", "-n", "default"), False),
        ):
            assert can_i(config, *args) is allowed, f"{config.name} can-i {' '.join(args)}"

        live = fleet.node("live")
        fleet.objs.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "sandboxnodes",
            live,
            {"metadata": {"finalizers": [f"{GROUP}/node-health"]}},
        )
        agent = fleet.lease(live)
        fleet.sandbox("done", live, "Stopped")
        fleet.objs.create_namespaced_custom_object(
            GROUP, VERSION, fleet.namespace, "sandboxpools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxPool",
                "metadata": {"name": "web"},
                "spec": {"replicas": 1, "template": {"spec": {"image": "example.test/b:1"}}},
            },
        )  # fmt: skip
        fleet.objs.create_cluster_custom_object(
            GROUP, VERSION, "cacheprunes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "CachePrune",
                "metadata": {"name": f"{fleet.prefix}-prune"},
                "spec": {"all": True},
            },
        )  # fmt: skip

        def run_job(phase: str, config: Path) -> int:
            """The Job's own command line and namespace, with its ServiceAccount's token."""
            (c,) = jobs[phase]["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e["value"] for e in c["env"]}
            namespace = ["--namespace", env["SANDLOT_NAMESPACE"]]
            return sandlot_main([*c["args"], *namespace, "--kubeconfig", str(config)])

        assert run_job("pre-delete", pre) == 0
        agent.stop()  # the DaemonSet is gone before the post-delete hook
        assert run_job("post-delete", post) == 0
        objs: Any = client.CustomObjectsApi(kube)
        for plural in (
            "sandboxpools",
            "sandboxes",
            "sandboxsnapshots",
            "cacheprunes",
            "sandboxnodes",
        ):
            left = objs.list_cluster_custom_object(GROUP, VERSION, plural)["items"]
            assert not left, f"{plural} left: {[i['metadata']['name'] for i in left]}"
        leases = client.CoordinationV1Api(kube).list_namespaced_lease(lease_namespace).items
        assert not leases, [lease.metadata and lease.metadata.name for lease in leases]
    finally:
        kubectl(
            "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            stdin=yaml.safe_dump_all(rbac),
        )  # fmt: skip
        wipe_nodes(kube)
