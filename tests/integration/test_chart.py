"""The Helm chart: lint, render, refuse bad values, and its objects and RBAC on the
real API server.

The RBAC tests are the point: the chart is applied (server-side) into the test
control plane, tokens are requested for the operator's and the agent's
ServiceAccounts through the TokenRequest API, and the real programs run with
those credentials only, through the node-health and agent scenarios. A verb the
chart forgot shows up as a 403 in their logs or as a scenario that never
finishes; both fail here.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.agent.metrics import AgentMetrics, GcMetrics
from sandlot.agent.settings import AgentSettings
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import POOL_LABEL
from sandlot.cli.main import main as sandlot_main
from sandlot.cli.options import env_name, settings_from
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.settings import OperatorSettings
from sandlot.devtools.controlplane import ControlPlane, helm_path, kubectl_path
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from tests.support.chart import (
    CHART,
    Installed,
    apply,
    by_kind,
    can_i,
    hook_of,
    operator_replica,
    render,
    run_helm,
    sa_kubeconfig,
)
from tests.support.containerd import PrivateContainerd
from tests.support.kube import Kubectl
from tests.support.operator import Fleet, OperatorProcess, wipe_nodes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

# 403 as a status, never the milliseconds of a log line's timestamp (",403").
FORBIDDEN = re.compile(r"forbidden|(?<![,.:])\b403\b|not enough permissions", re.IGNORECASE)


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_path()


def container_env(workload: dict[str, Any]) -> dict[str, Any]:
    """The container's environment; downward-API values become their field path."""
    env = {}
    for item in workload["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = "<" + item["valueFrom"]["fieldRef"]["fieldPath"] + ">"
    return env


ALL_ON = (
    "--set",
    "metrics.serviceMonitor.enabled=true,prometheusRule.enabled=true,"
    "grafanaDashboard.enabled=true,agent.cni.mount=true,agent.privileged=true",
)

# ---------------------------------------------------------------------- lint, render


def test_helm_lint_strict_passes(helm: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout


def test_defaults_render_the_operator_agent_rbac_services_and_pdb(helm: Path) -> None:
    docs = [d for d in render(helm) if not hook_of(d)]
    kinds = sorted(d["kind"] for d in docs)
    for kind in ("Deployment", "DaemonSet", "PodDisruptionBudget", "ClusterRole", "Role"):
        assert kind in kinds
    assert kinds.count("ServiceAccount") == 2 and kinds.count("Service") == 2
    assert not {"ServiceMonitor", "PrometheusRule", "ConfigMap"} & set(kinds), "optional ones on"

    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 2
    (op,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = op["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["privileged"] is False
    assert op["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert op["readinessProbe"]["httpGet"]["port"] == "metrics"
    # Liveness and readiness are different checks (sandlot.policy.probes).
    assert op["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert op["startupProbe"]["httpGet"]["path"] == "/livez"
    assert op["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert op["resources"]["requests"] and op["args"] == ["operator"]
    assert op["resources"]["requests"]["ephemeral-storage"]
    assert op["resources"]["limits"]["ephemeral-storage"]

    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork")
    assert {"operator": "Exists"} in pod["tolerations"], "the agent must tolerate every taint"
    assert agent["securityContext"]["privileged"] is False
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agent["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert agent["startupProbe"]["httpGet"]["path"] == "/livez"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["resources"]["requests"]["ephemeral-storage"]
    assert agent["resources"]["limits"]["ephemeral-storage"]
    assert not by_kind(docs, "NetworkPolicy"), "the NetworkPolicy is optional"
    env = container_env(ds)
    assert env["SANDLOT_NODE_NAME"] == "<spec.nodeName>"
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths == {
        "containerd-socket": "/run/containerd",
        "containerd-root": "/var/lib/containerd",
        "sandbox-logs": "/var/log/sandlot",
        "host-cgroup": "/sys/fs/cgroup",
    }
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["containerd-root"]["readOnly"] is True
    assert mounts["host-cgroup"]["readOnly"] is True
    assert env["SANDLOT_CGROUP_ROOT"] == mounts["host-cgroup"]["mountPath"]

    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1


def test_every_setting_of_both_programs_is_a_value_reaching_its_variable(helm: Path) -> None:
    docs = render(helm)
    for kind, model in (("Deployment", OperatorSettings), ("DaemonSet", AgentSettings)):
        env = container_env(by_kind(docs, kind)[0])
        wanted = {env_name(f) for f in model.model_fields}
        assert set(env) == wanted, (
            f"{kind}: missing {wanted - set(env)}, unknown {set(env) - wanted}"
        )


def test_rendered_values_are_accepted_by_the_programs_settings(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "operator": {"gracePeriod": "45s", "disruptionThreshold": 0.4},
                "agent": {
                    "killWait": "3s",
                    "gc": {
                        "enabled": False,
                        "highThresholdPercent": 90,
                        "minFreeBytes": 10 * 1024**3,
                        "targetFreeBytes": 20 * 1024**3,
                        "pinnedImages": ["a.test/x:1", "b.test/y:2"],
                    },
                },
            }
        )
    )
    docs = render(helm, "-f", str(values))
    empty = argparse.Namespace()
    op = settings_from(
        OperatorSettings, empty, environ=container_env(by_kind(docs, "Deployment")[0])
    )
    assert op.grace_period == timedelta(seconds=45) and op.disruption_threshold == 0.4
    assert op.namespace == "sandlot-system"
    agent = settings_from(
        AgentSettings, empty, environ=container_env(by_kind(docs, "DaemonSet")[0])
    )
    assert agent.kill_wait == timedelta(seconds=3) and agent.gc_disabled is True
    assert agent.gc_high == 90 and agent.gc_min_free == 10 * 1024**3
    assert agent.gc_target_free == 20 * 1024**3
    assert agent.pinned_images == ("a.test/x:1", "b.test/y:2", "ghcr.io/sandlot/sandlot:0.1.0")


def test_every_optional_feature_renders(helm: Path) -> None:
    docs = render(helm, *ALL_ON)
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ServiceMonitor") == 2 and kinds.count("PrometheusRule") == 1
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["sandlot.json"])
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Nodes by phase", "Sandboxes by phase", "Teardown kill-wait timeouts"):
        assert wanted in titles
    (rule,) = by_kind(docs, "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts == [
        "SandlotMassFailureHoldActive",
        "SandlotTeardownKillWaitTimeouts",
        "SandlotImageGcExhausted",
    ]
    (ds,) = by_kind(docs, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"]
    names = {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert {"cni-conf", "cni-bin"} <= names


def _exported_metric_names() -> set[str]:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    AgentMetrics(registry)
    GcMetrics(registry)
    names = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def test_dashboard_and_alerts_use_only_metrics_the_programs_export(helm: Path) -> None:
    docs = render(helm, *ALL_ON)
    (cm,) = by_kind(docs, "ConfigMap")
    (rule,) = by_kind(docs, "PrometheusRule")
    exprs = [
        t["expr"] for p in json.loads(cm["data"]["sandlot.json"])["panels"] for t in p["targets"]
    ]
    exprs += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\bsandlot_[a-z_]+", e)}
    assert used and used <= _exported_metric_names(), used - _exported_metric_names()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"operator": {"gracePeriod": "5 minutes"}}, "operator.gracePeriod"),
        ({"operator": {"disruptionThreshold": 1.5}}, "operator.disruptionThreshold"),
        ({"operator": {"replicas": 0}}, "operator.replicas"),
        ({"operator": {"gracePerod": "3s"}}, "gracePerod"),
        ({"agent": {"gc": {"highThresholdPercent": 101}}}, "agent.gc.highThresholdPercent"),
        ({"agent": {"gc": {"lowThresholdPercent": 90}}}, "agent.gc.lowThresholdPercent"),
        ({"agent": {"renewInterval": "90s"}}, "agent.renewInterval"),
        ({"agent": {"teardownConcurrency": "eight"}}, "agent.teardownConcurrency"),
        ({"agent": {"containerdAddress": "run/containerd.sock"}}, "agent.containerdAddress"),
        ({"admissionPolicy": {"defaultLevel": "lax"}}, "admissionPolicy.defaultLevel"),
        ({"agent": {"cni": {"mount": True}}}, "agent.privileged"),
    ],
    ids=[
        "duration-without-unit-syntax",
        "threshold-above-one",
        "no-operator-replica",
        "misspelt-setting",
        "gc-high-above-100",
        "gc-low-not-below-high",
        "renew-not-below-lease",
        "concurrency-not-a-number",
        "relative-socket-path",
        "unknown-policy-level",
        "cni-mount-without-privileged",
    ],
)
def test_bad_values_are_refused_naming_the_value(
    helm: Path, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "template", "sl", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    # The schema names a value by its path (/agent/gc/x), the chart's checks by dots.
    assert named in proc.stderr.replace("/", "."), proc.stderr


# ------------------------------------------------------------ on the real API server


@pytest.fixture(scope="module")
def installed(helm: Path, kube: client.ApiClient, kubectl: Kubectl) -> Iterator[Installed]:
    """The chart's objects (defaults plus the dashboard) in a fresh release namespace."""
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"sl{suffix}", f"sandlot-{suffix}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    # The sandbox admission policy is cluster-wide: installed here it would refuse the
    # hostNetwork and privileged sandboxes other tests on this control plane create.
    # tests/integration/test_isolation.py installs the same objects (drift-tested
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
    apply(kubectl, docs)
    yield Installed(release, namespace, docs)
    # Cluster-scoped objects (RBAC, admission policies) outlive the namespace: delete
    # every rendered object by name.
    kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )
    core.delete_namespace(namespace)


def test_chart_objects_pass_server_side_validation(installed: Installed, kubectl: Kubectl) -> None:
    # Applied by the fixture; applying again with a server dry run re-validates each one.
    out = apply(kubectl, installed.docs, "--dry-run=server")
    for doc in installed.docs:
        assert f"/{doc['metadata']['name']} serverside-applied" in out, (doc["kind"], out)
    got = kubectl(
        "get", "deploy,ds,sa,svc,pdb,role,rolebinding,cm", "-n", installed.namespace, "-o", "name"
    ).stdout
    for doc in installed.docs:
        if doc["metadata"].get("namespace"):
            assert doc["metadata"]["name"] in got, f"{doc['kind']} {doc['metadata']['name']}"


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
        ("operator", ("get", "secrets", "-A"), False),
        ("operator", ("list", "secrets", "-A"), False),
        ("operator", ("get", "nodes"), False),
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
        "operator-cannot-read-secrets",
        "operator-cannot-list-secrets",
        "operator-reads-no-nodes",
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
    "sandboxnodes.sandlot.dev": "create get list watch",
    "sandboxnodes.sandlot.dev/status": "patch",
    "sandboxes.sandlot.dev": "get list watch",
    "sandboxes.sandlot.dev/status": "patch",
    "cacheprunes.sandlot.dev": "list watch",
    "cacheprunes.sandlot.dev/status": "patch",
    "namespaces": "get",
    # Its Kubernetes Node's taints, mirrored at registration.
    "nodes": "get",
    "events": "create",
    "leases.coordination.k8s.io": "create get update",
    # A token of its node's identity only (agent-identity-policy.yaml refuses others).
    "serviceaccounts/token": "create",
    # sandlot logs / exec: the caller's token and access reviewed, nothing stored.
    "tokenreviews.authentication.k8s.io": "create",
    "subjectaccessreviews.authorization.k8s.io": "create",
}
OPERATOR_REACH = {
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
    "sandboxclaims.sandlot.dev": "get list watch",
    "sandboxclaims.sandlot.dev/status": "get patch",
    "services": "create delete get update",
    "endpointslices.discovery.k8s.io": "create delete list patch",
    "events": "create",
    "customresourcedefinitions.apiextensions.k8s.io": "get list watch",
    "leases.coordination.k8s.io": "create get list update watch",
    # Brokered pull credentials: each node's Secret, identity, Role and RoleBinding.
    "secrets": "create get update",
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
    core = client.CoreV1Api(kube)
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

    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
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


def test_operator_reaps_a_lost_node_with_its_service_account_only(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    wipe_nodes(kube)
    fleet = Fleet(kube, namespace, installed.namespace)
    config, identity = operator_replica(kube, control_plane, installed, tmp_path)
    op = OperatorProcess(
        control_plane,
        tmp_path,
        installed.namespace,
        "--grace-period",
        "3s",
        "--resync-interval",
        "1s",
        kubeconfig=config,
        identity=identity,
    )
    try:
        op.wait_metrics()
        n1 = fleet.node("n1")
        lease = fleet.lease(n1)
        fleet.sandbox("run", n1, "Running")
        wait_for(lambda: op.is_leader(), timeout=20, what="the operator to lead via its Lease")
        wait_for(
            lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
            timeout=20,
            what="node Ready while its lease is renewed",
        )
        lease.pause()
        wait_for(lambda: fleet.phase("run") == "Dead", timeout=30, what="sandbox Dead after grace")
        assert fleet.get("run")["status"]["reason"] == "NodeLost"
        # The node's deletion runs kopf's finalizer path with the same credentials.
        client.CustomObjectsApi(kube).delete_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", n1
        )
        wait_for(
            lambda: n1 not in {n["metadata"]["name"] for n in _nodes(kube)},
            timeout=20,
            what=f"SandboxNode {n1} deleted through the operator's finalizer",
        )
    finally:
        op.stop()
        fleet.cleanup()
    denied = [line for line in op.log_path.read_text().splitlines() if FORBIDDEN.search(line)]
    assert not denied, "the operator was refused:\n" + "\n".join(denied[:20])


def _nodes(kube: client.ApiClient) -> list[dict[str, Any]]:
    objs: Any = client.CustomObjectsApi(kube)
    return list(objs.list_cluster_custom_object(GROUP, VERSION, "sandboxnodes")["items"])


AGENT_IMAGE = "docker.io/sandlot/chart-busybox:test"


@pytest.fixture
def agent_ctr_ns(
    containerd: PrivateContainerd, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    from sandlot.adapters.containerd import ContainerdRuntime
    from sandlot.agent.teardown import teardown_many

    archive = tmp_path_factory.mktemp("chart-images") / "busybox.tar"
    build_image_archive(archive, AGENT_IMAGE)
    ns = f"chart-{uuid.uuid4().hex[:8]}"
    import_archive(containerd.address, ns, archive, timeout=60)
    yield ns
    rt = ContainerdRuntime(containerd.address, ns)
    try:
        ids = [c.id for c in rt.list_containers(timeout=10)]
        teardown_many(rt, ids, kill_wait=3, call_timeout=3, concurrency=8)
    finally:
        rt.close()


@pytest.mark.containerd
def test_agent_and_operator_run_the_node_story_with_their_service_accounts(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    containerd: PrivateContainerd,
    agent_ctr_ns: str,
    namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool with a Service: its member is scheduled, run by the agent and routed;
    a CachePrune is answered; the agent stops, its node is reaped after the grace
    and the member leaves the EndpointSlice; the agent comes back, tears the Dead
    member's container down and runs its replacement. Both programs hold only
    their own ServiceAccount's token, the agent's bound to a Pod on its node as a
    DaemonSet pod's is, under the chart's write policies."""
    caplog.set_level(logging.INFO, logger="sandlot")
    wipe_nodes(kube)
    node = f"chart-{uuid.uuid4().hex[:6]}"
    objs: Any = client.CustomObjectsApi(kube)
    discovery = client.DiscoveryV1Api(kube)
    agent_config = sa_kubeconfig(
        kube, control_plane, installed, "agent", tmp_path / "a.kubeconfig", node=node
    )
    op_config, op_identity = operator_replica(kube, control_plane, installed, tmp_path)
    agent_api = load_api_client(str(agent_config))
    agents: list[Agent] = []

    def start_agent() -> Agent:
        values: dict[str, Any] = {
            "node_name": node,
            "namespace": installed.namespace,
            "containerd_address": containerd.address,
            "containerd_namespace": agent_ctr_ns,
            "containerd_root": str(containerd.root),
            "lease_duration": "2s",
            "renew_interval": "0.5s",
            "kill_wait": "2s",
            "call_timeout": "2s",
            "stop_grace": "1s",
            "reap_interval": "1s",
            "sync_interval": "0.3s",
            "metrics_port": 0,
            "node_address": "10.9.8.7",
            "log_dir": str(tmp_path / "logs"),
        }
        agent = Agent(AgentSettings(**values), agent_api, registry=CollectorRegistry())
        agents.append(agent)
        assert agent.start(), "agent start-up failed"
        return agent

    def members() -> list[dict[str, Any]]:
        out = objs.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", label_selector=f"{POOL_LABEL}=web"
        )
        return list(out["items"])

    def running() -> list[dict[str, Any]]:
        return [m for m in members() if (m.get("status") or {}).get("phase") == "Running"]

    def endpoints() -> list[str]:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=web"
        ).items
        return [a for sl in slices for ep in (sl.endpoints or []) for a in ep.addresses]

    op = OperatorProcess(
        control_plane,
        tmp_path,
        installed.namespace,
        "--grace-period",
        "3s",
        "--resync-interval",
        "1s",
        kubeconfig=op_config,
        identity=op_identity,
    )
    prune = f"prune-{uuid.uuid4().hex[:6]}"
    try:
        op.wait_metrics()
        first = start_agent()
        wait_for(
            lambda: (
                (
                    objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node).get(
                        "status"
                    )
                    or {}
                ).get("phase")
                == "Ready"
            ),
            timeout=20,
            what=f"node {node} Ready from the agent's Lease",
        )
        objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "sandboxpools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxPool",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "serviceName": "web",
                    "template": {
                        "spec": {
                            "image": AGENT_IMAGE,
                            "command": ["sleep", "1000"],
                            "ports": [{"containerPort": 8080}],
                        }
                    },
                },
            },
        )
        (member,) = wait_for(running, timeout=30, what="the pool's member Running")
        container = member["status"]["containerId"]
        wait_for(
            lambda: endpoints() == ["10.9.8.7"], timeout=20, what="the member in the EndpointSlice"
        )
        client.CoreV1Api(kube).read_namespaced_service("web", namespace)

        objs.create_cluster_custom_object(
            GROUP,
            VERSION,
            "cacheprunes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "CachePrune",
                "metadata": {"name": prune},
                "spec": {"all": True, "nodes": [node]},
            },
        )
        entry = wait_for(
            lambda: (
                (
                    objs.get_cluster_custom_object(GROUP, VERSION, "cacheprunes", prune).get(
                        "status"
                    )
                    or {}
                )
                .get("results", {})
                .get(node)
            ),
            timeout=20,
            what=f"CachePrune {prune} answered by {node}",
        )
        assert entry["pass"] == "forced" and not entry.get("error"), entry

        first.shutdown()  # the container keeps running; the Lease stops
        name = member["metadata"]["name"]

        def phase_of_member() -> str | None:
            found = [m for m in members() if m["metadata"]["name"] == name]
            return (found[0].get("status") or {}).get("phase") if found else "gone"

        wait_for(lambda: phase_of_member() == "Dead", timeout=30, what=f"{name} Dead")
        wait_for(lambda: endpoints() == [], timeout=20, what=f"{name} out of the EndpointSlice")

        second = start_agent()
        # start() returns after the sweep: the fenced container is gone already.
        assert container not in {c.id for c in list_containers(containerd, agent_ctr_ns)}
        assert second.registry.get_sample_value("sandlot_agent_fenced_total") == 1
        (replacement,) = wait_for(running, timeout=30, what="the replacement member Running")
        assert replacement["metadata"]["name"] != name
    finally:
        for agent in agents:
            agent.shutdown()
        op.stop()
        agent_api.close()
        with contextlib.suppress(client.ApiException):
            objs.delete_cluster_custom_object(GROUP, VERSION, "cacheprunes", prune)
        wipe_nodes(kube)

    denied = [r.getMessage() for r in caplog.records if FORBIDDEN.search(r.getMessage())]
    assert not denied, "the agent was refused:\n" + "\n".join(denied[:20])
    denied = [line for line in op.log_path.read_text().splitlines() if FORBIDDEN.search(line)]
    assert not denied, "the operator was refused:\n" + "\n".join(denied[:20])


def list_containers(containerd: PrivateContainerd, ns: str) -> list[Any]:
    from sandlot.adapters.containerd import ContainerdRuntime

    rt = ContainerdRuntime(containerd.address, ns)
    try:
        return list(rt.list_containers(timeout=10))
    finally:
        rt.close()


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
    (deploy,) = by_kind(docs, "Deployment")
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
        for plural in ("sandboxpools", "sandboxes", "cacheprunes", "sandboxnodes"):
            left = objs.list_cluster_custom_object(GROUP, VERSION, plural)["items"]
            assert not left, f"{plural} left: {[i['metadata']['name'] for i in left]}"
        leases = client.CoordinationV1Api(kube).list_namespaced_lease(lease_namespace).items
        assert not leases, [lease.metadata.name for lease in leases]
    finally:
        kubectl(
            "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            stdin=yaml.safe_dump_all(rbac),
        )  # fmt: skip
        wipe_nodes(kube)


def test_kubectl_finds_the_sandlot_plugin(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "kubectl-sandlot").exists(), f"no kubectl-sandlot in {venv_bin}"
    env = dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    env["KUBECONFIG"] = str(tmp_path / "none")
    plugins = subprocess.run(
        [str(kubectl_path()), "plugin", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert str(venv_bin / "kubectl-sandlot") in plugins.stdout, plugins.stdout + plugins.stderr
    proc = subprocess.run(
        [str(kubectl_path()), "sandlot", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: sandlot" in proc.stdout and "operator" in proc.stdout
