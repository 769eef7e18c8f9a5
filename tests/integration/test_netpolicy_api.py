"""The API server itself refuses a malformed spec.networkPolicy, naming the field
(the CRD's schema and CEL rules), and keeps a good one. Claimed against the real
kube-apiserver."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api import GROUP, VERSION

pytestmark = pytest.mark.integration


def _create(kube: client.ApiClient, namespace: str, name: str, policy: dict[str, Any]) -> Any:
    return client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"image": "example.test/busybox:1", "networkPolicy": policy},
        },
    )


@pytest.mark.parametrize(
    ("policy", "field", "says"),
    [
        (
            {"egress": [{"to": [{"ipBlock": {"cidr": "not-a-cidr"}}]}]},
            "spec.networkPolicy.egress[0].to[0].ipBlock.cidr",
            "must be a CIDR",
        ),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["nope"]}}]}]},
            "spec.networkPolicy.ingress[0].from[0].ipBlock.except[0]",
            "must be a CIDR",
        ),
        (
            {"ingress": [{"from": [{}]}]},
            "spec.networkPolicy.ingress[0].from[0]",
            "exactly one of sandboxSelector and ipBlock",
        ),
        (
            {"ingress": [{"ports": [{"port": 70000}]}]},
            "spec.networkPolicy.ingress[0].ports[0].port",
            "65535",
        ),
        (
            {"egress": [{"ports": [{"protocol": "ICMP"}]}]},
            "spec.networkPolicy.egress[0].ports[0].protocol",
            "Unsupported value",
        ),
    ],
    ids=["cidr", "except", "peer-with-neither", "port", "protocol"],
)
def test_a_bad_network_policy_is_refused_naming_the_field(
    kube: client.ApiClient, namespace: str, policy: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ApiException) as err:
        _create(kube, namespace, "bad", policy)
    assert err.value.status == 422, err.value.body
    message = str(json.loads(err.value.body or "")["message"])
    assert field in message and says in message, message


def test_a_good_network_policy_is_kept_as_written(kube: client.ApiClient, namespace: str) -> None:
    policy = {
        "ingress": [
            {
                "from": [
                    {"sandboxSelector": {"matchLabels": {"role": "client"}}},
                    {"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.8/29"]}},
                ],
                "ports": [{"protocol": "TCP", "port": 8080}],
            }
        ],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.96.0.10/32"}}], "ports": [{"port": 53}]}],
    }
    created = _create(kube, namespace, "good", policy)
    stored = created["spec"]["networkPolicy"]
    assert stored["ingress"][0]["from"][1]["ipBlock"]["except"] == ["203.0.113.8/29"]
    assert stored["ingress"][0]["from"][0]["sandboxSelector"]["matchLabels"] == {"role": "client"}
    assert stored["egress"][0]["ports"] == [{"port": 53, "protocol": "TCP"}]
