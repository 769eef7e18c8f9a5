"""The chart's agent-sandbox face: nothing of it by default; behind
``agentSandbox.enabled`` its CRDs, the operator's controller, the router's
APIService and the tenants' rights; and never installed over CRDs another owner
(agent-sandbox's own controller) put in the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.agentsandbox import AGENT_SANDBOX_KINDS
from tests.integration.test_chart_render import container_env
from tests.support.chart import CHART, by_kind, helm, render, run_helm
from tests.support.kube import agent_sandbox_crds

__all__ = ["helm"]  # fixtures

pytestmark = pytest.mark.integration

ON = ("--set", "agentSandbox.enabled=true")
NAMES = {f"{k.crd.plural}.{k.crd.group}" for k in AGENT_SANDBOX_KINDS}


def _agent_sandbox_docs(docs: list[dict[str, Any]]) -> list[str]:
    return [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs
        if "agents.x-k8s.io" in str(d) or "router.sandlot.dev" in str(d)
    ]


def test_off_by_default_and_whole_when_enabled(helm: Path) -> None:
    off = render(helm)
    assert _agent_sandbox_docs(off) == []
    operator = next(
        d for d in by_kind(off, "Deployment") if d["metadata"]["name"].endswith("-operator")
    )
    assert container_env(operator)["SANDLOT_AGENT_SANDBOX"] == "false"

    on = render(helm, *ON)
    crds = {d["metadata"]["name"] for d in by_kind(on, "CustomResourceDefinition")}
    assert crds == NAMES
    services = {d["metadata"]["name"]: d for d in by_kind(on, "APIService")}
    router = services["v1alpha1.router.sandlot.dev"]
    assert router["spec"]["service"]["port"] == 444
    deployments = {d["metadata"]["name"]: d for d in by_kind(on, "Deployment")}
    gateway = next(d for n, d in deployments.items() if n.endswith("-gateway"))
    operator = next(d for n, d in deployments.items() if n.endswith("-operator"))
    assert container_env(gateway)["SANDLOT_ROUTER"] == "true"
    assert container_env(operator)["SANDLOT_AGENT_SANDBOX"] == "true"
    edit = next(d for d in by_kind(on, "ClusterRole") if d["metadata"]["name"].endswith("-edit"))
    router_rule = next(r for r in edit["rules"] if r["apiGroups"] == ["router.sandlot.dev"])
    assert "routers/execute" in router_rule["resources"] and "create" in router_rule["verbs"]


def test_it_refuses_to_install_over_another_owners_crds_and_upgrades_its_own(
    helm: Path, kube: client.ApiClient, control_plane: Any
) -> None:
    # agent-sandbox's CRDs as its own install leaves them: no Helm release of ours.
    with agent_sandbox_crds(kube):
        ext: Any = client.ApiextensionsV1Api(kube)
        for name in NAMES:
            ext.patch_custom_resource_definition(
                name, {"metadata": {"annotations": {"meta.helm.sh/release-name": None}}}
            )
        server = ("--dry-run=server", "--kubeconfig", str(control_plane.kubeconfig))
        refused = run_helm(
            helm, "template", "mine", str(CHART), "-n", "sandlot-system", *ON, *server, check=False
        )
        assert refused.returncode != 0
        assert (
            "agentSandbox.enabled" in refused.stderr and "is not this release's" in refused.stderr
        )
        assert any(name in refused.stderr for name in NAMES), refused.stderr

        for name in NAMES:  # this release's own, from an earlier install: an upgrade goes on
            ext.patch_custom_resource_definition(
                name, {"metadata": {"annotations": {"meta.helm.sh/release-name": "mine"}}}
            )
        ours = run_helm(helm, "template", "mine", str(CHART), "-n", "sandlot-system", *ON, *server)
        assert ours.returncode == 0
