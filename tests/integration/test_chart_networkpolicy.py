"""The chart's optional NetworkPolicies, rendered by the real helm: the metrics port
of each program in, and the agent's stream port (`sandlot logs`, `sandlot exec`,
reached through the API server) whenever it is on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandlot.devtools.controlplane import helm_path
from tests.support.chart import by_kind, render

pytestmark = pytest.mark.integration

PROMETHEUS = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
API_SERVERS = {"ipBlock": {"cidr": "10.0.0.0/24"}}


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_path()


def render_policies(helm: Path, *args: str) -> list[dict[str, Any]]:
    policies: list[dict[str, Any]] = render(
        helm,
        "--set", "metrics.networkPolicy.enabled=true",
        "--set-json", f"metrics.networkPolicy.from=[{json.dumps(PROMETHEUS)}]",
        *args,
    )  # fmt: skip
    return policies


def by_component(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p
        for p in by_kind(docs, "NetworkPolicy")
    }


def test_the_network_policy_lets_only_the_metrics_port_in(helm: Path) -> None:
    found = by_component(render_policies(helm, "--set", "agent.streamPort=0"))
    assert set(found) == {"operator", "agent", "cleanup"}
    cleanup = found.pop("cleanup")["spec"]
    assert (cleanup["policyTypes"], cleanup.get("ingress")) == (["Ingress"], None), "none in"
    for component, policy in found.items():
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert rule["from"] == [PROMETHEUS]


GATEWAY_PODS = {
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "sandlot",
            "app.kubernetes.io/instance": "sl",
            "app.kubernetes.io/component": "gateway",
        }
    }
}


@pytest.mark.parametrize(
    ("stream_from", "expected_from"),
    [([], [GATEWAY_PODS]), ([API_SERVERS], [GATEWAY_PODS, API_SERVERS])],
    ids=["from_the_gateway_by_default", "and_from_the_peers_given"],
)
def test_the_agents_stream_port_is_let_in_from_the_gateway_when_it_is_on(
    helm: Path, stream_from: list[dict[str, Any]], expected_from: list[dict[str, Any]] | None
) -> None:
    docs = render_policies(
        helm, "--set-json", f"metrics.networkPolicy.streamFrom={json.dumps(stream_from)}"
    )
    found = by_component(docs)
    metrics, stream = found["agent"]["spec"]["ingress"]
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [PROMETHEUS]}
    assert stream["ports"] == [{"port": "stream", "protocol": "TCP"}]
    assert stream.get("from") == expected_from, "only the gateway (and peers given) may stream"
    (https,) = found["gateway"]["spec"]["ingress"][1:]
    assert https == {"ports": [{"port": "https", "protocol": "TCP"}]}, "the API server's way in"
    (operator_rule,) = found["operator"]["spec"]["ingress"]
    assert operator_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]

    (daemonset,) = by_kind(docs, "DaemonSet")
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["stream"] == 10350, "the policy's named port is the agent's stream port"
