"""The write policies as data: the chart's copy, and what they are generated from."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.api.cacheprune import CachePruneStatus
from sandlot.api.node import SandboxNodeStatus
from sandlot.api.writepolicy import (
    CHART_TEMPLATE,
    NODE_STATUS_OF_THE_OPERATOR,
    Identities,
    agent_policy,
    chart_template,
    write_policies,
)

ROOT = Path(__file__).resolve().parents[2]
IDS = Identities("sl-sandlot", "ns", "sl-sandlot-agent", "sl-sandlot-operator", "leader")


def test_committed_write_policy_template_matches_the_policies() -> None:
    committed = (ROOT / CHART_TEMPLATE).read_text()
    assert committed == chart_template(), (
        f"{CHART_TEMPLATE} is out of date; regenerate with `sandlot gen admission` and commit it"
    )


def test_every_rule_names_itself_in_its_message() -> None:
    for obj in write_policies(IDS):
        if obj["kind"] != "ValidatingAdmissionPolicy":
            continue
        for validation in obj["spec"]["validations"]:
            assert f"{obj['metadata']['name']}: rule " in validation["messageExpression"]


@pytest.mark.parametrize(
    ("policy", "user"),
    [(0, IDS.agent_user), (2, IDS.operator_user)],
    ids=["agent", "operator"],
)
def test_policies_bind_only_their_identity(policy: int, user: str) -> None:
    (condition,) = write_policies(IDS)[policy]["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"


def test_cacheprune_rule_keeps_every_operator_field_of_the_status() -> None:
    (rule,) = [
        v
        for v in agent_policy(IDS)[0]["spec"]["validations"]
        if "agent-cacheprune-own-entry" in v["messageExpression"]
    ]
    operator_fields = [
        info.alias or name
        for name, info in CachePruneStatus.model_fields.items()
        if name != "results"
    ]
    assert operator_fields
    for field in operator_fields:
        assert f"object.?status.?{field}.orValue(" in rule["expression"], field


def test_node_status_kept_from_the_agent_is_the_operators_and_not_what_it_registers() -> None:
    assert set(NODE_STATUS_OF_THE_OPERATOR) <= set(SandboxNodeStatus.model_fields)
    registered = {"capacity", "address", "agent_version", "containerd_version", "gc"}
    assert not registered & set(NODE_STATUS_OF_THE_OPERATOR)
