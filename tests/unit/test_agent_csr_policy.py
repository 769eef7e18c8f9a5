"""Which agent certificate requests the operator signs (policy.agentcerts)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sandlot.api.keys import AGENT_SIGNER, NODE_NAME_EXTRA, POD_NAME_EXTRA
from sandlot.policy.agentcerts import (
    AGENT_COMMON_NAME,
    AGENT_NAME_SUFFIX,
    AgentCsr,
    agent_server_name,
    certified_node,
    decide_agent_csr,
    renew_after,
)

AGENT = "system:serviceaccount:sandlot-system:sandlot-agent"

A_OWN = AgentCsr(
    name="agent-a-1",
    signer_name=AGENT_SIGNER,
    username=AGENT,
    extra={NODE_NAME_EXTRA: ["node-a"], POD_NAME_EXTRA: ["sandlot-agent-x7k2p"]},
    usages=("digital signature", "server auth"),
    common_name=AGENT_COMMON_NAME,
    dns_names=(agent_server_name("node-a"),),
    key="ec:secp256r1",
    signature_valid=True,
)


def test_an_agent_asking_for_its_own_node_is_signed_for_that_node() -> None:
    decision = decide_agent_csr(A_OWN, agent_user=AGENT)
    assert (decision.action, decision.node) == ("sign", "node-a")


@pytest.mark.parametrize(
    ("csr", "reason"),
    [
        (replace(A_OWN, dns_names=(agent_server_name("node-b"),)), "NotItsNode"),
        (
            replace(A_OWN, dns_names=(agent_server_name("node-a"), agent_server_name("node-b"))),
            "NotItsNode",
        ),
        (replace(A_OWN, other_names=("IP:10.0.0.2",)), "NotItsNode"),
        (replace(A_OWN, dns_names=("node-a",)), "NotItsNode"),
        (replace(A_OWN, common_name="sandlot-gateway"), "WrongCommonName"),
        (replace(A_OWN, username="system:serviceaccount:tenant:sandlot-agent"), "NotTheAgent"),
        (replace(A_OWN, username="system:node:node-a"), "NotTheAgent"),
        (replace(A_OWN, extra={}), "NotBoundToANode"),
        (replace(A_OWN, extra={NODE_NAME_EXTRA: ["node-a"]}), "NotBoundToANode"),
        (
            replace(A_OWN, extra={NODE_NAME_EXTRA: ["node-a", "node-b"], POD_NAME_EXTRA: ["p"]}),
            "NotBoundToANode",
        ),
        (replace(A_OWN, usages=("digital signature", "client auth")), "WrongUsages"),
        (replace(A_OWN, usages=("server auth", "cert sign")), "WrongUsages"),
        (replace(A_OWN, key="rsa:1024"), "BadKey"),
        (replace(A_OWN, key="ed25519:"), "BadKey"),
        (replace(A_OWN, signature_valid=False), "BadKey"),
    ],
    ids=[
        "another-node",
        "its-node-and-another",
        "an-ip-address",
        "the-bare-node-name",
        "the-gateway-name",
        "another-namespace-service-account",
        "the-kubelet",
        "a-token-bound-to-no-pod",
        "a-node-but-no-pod",
        "two-nodes",
        "client-auth",
        "a-ca",
        "a-weak-rsa-key",
        "an-unknown-key",
        "a-key-it-does-not-hold",
    ],
)
def test_a_request_that_is_not_its_own_nodes_agents_is_denied(csr: AgentCsr, reason: str) -> None:
    decision = decide_agent_csr(csr, agent_user=AGENT)
    assert (decision.action, decision.reason) == ("deny", reason), decision.message


def test_a_node_a_request_for_node_b_names_both_in_its_message() -> None:
    csr = replace(A_OWN, dns_names=(agent_server_name("node-b"),))
    message = decide_agent_csr(csr, agent_user=AGENT).message
    assert "node-a" in message and agent_server_name("node-b") in message


def test_a_wrong_request_approved_by_someone_else_is_still_not_signed() -> None:
    csr = replace(A_OWN, dns_names=(agent_server_name("node-b"),), approved=True)
    assert decide_agent_csr(csr, agent_user=AGENT).action == "fail"


def test_a_right_request_approved_by_someone_else_is_signed() -> None:
    assert decide_agent_csr(replace(A_OWN, approved=True), agent_user=AGENT).action == "sign"


def test_a_long_node_name_is_refused_before_it_is_compared() -> None:
    node = "n" * 240
    csr = replace(
        A_OWN,
        extra={NODE_NAME_EXTRA: [node], POD_NAME_EXTRA: ["p"]},
        dns_names=(agent_server_name(node),),
    )
    assert decide_agent_csr(csr, agent_user=AGENT).reason == "NodeNameTooLong"


@pytest.mark.parametrize(
    "csr",
    [
        replace(A_OWN, signer_name="kubernetes.io/kubelet-serving"),
        replace(A_OWN, issued=True),
        replace(A_OWN, denied=True),
        replace(A_OWN, failed=True),
    ],
    ids=["another-signer", "issued", "denied", "failed"],
)
def test_requests_not_ours_or_answered_are_left_alone(csr: AgentCsr) -> None:
    assert decide_agent_csr(csr, agent_user=AGENT).action == "skip"


@pytest.mark.parametrize(
    ("not_before", "not_after", "after"),
    [(0.0, 3600.0, 2400.0), (1000.0, 1000.0 + 7 * 86400, 7 * 86400 * 2 / 3), (50.0, 10.0, 0.0)],
    ids=["an-hour", "a-week-signed-by-a-clock-far-from-ours", "nonsense-renews-at-once"],
)
def test_an_agent_renews_after_two_thirds_of_the_lifetime_the_signer_gave(
    not_before: float, not_after: float, after: float
) -> None:
    assert renew_after(not_before, not_after) == pytest.approx(after)


@pytest.mark.parametrize(
    ("names", "node"),
    [
        ((agent_server_name("node-a"),), "node-a"),
        ((agent_server_name("node-a"), agent_server_name("node-b")), ""),
        ((agent_server_name("node-a"), "node-a"), ""),
        (("node-a",), ""),
        ((AGENT_NAME_SUFFIX.lstrip("."),), ""),
        ((AGENT_NAME_SUFFIX,), ""),
        ((agent_server_name("*"),), ""),
        ((), ""),
    ],
    ids=[
        "one-node",
        "two-nodes",
        "its-name-and-another",
        "the-bare-node-name",
        "the-suffix-alone",
        "an-empty-node",
        "a-wildcard",
        "no-names",
    ],
)
def test_a_certificate_names_a_node_only_with_exactly_one_agent_name(
    names: tuple[str, ...], node: str
) -> None:
    assert certified_node(names) == node
