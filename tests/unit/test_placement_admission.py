"""The placement admission policy as data (the chart's copy), and the label that
tells it which SandboxNodes to evaluate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandlot.api.keys import TAINTED_LABEL
from sandlot.api.placementpolicy import CHART_TEMPLATE, RULE, chart_template, placement_policy
from sandlot.policy.placement import tainted_label

ROOT = Path(__file__).resolve().parents[2]


def test_committed_placement_policy_template_matches_the_policy() -> None:
    committed = (ROOT / CHART_TEMPLATE).read_text()
    assert committed == chart_template(), (
        f"{CHART_TEMPLATE} is out of date; regenerate with `sandlot gen admission` and commit it"
    )


def test_binding_evaluates_only_labelled_nodes_and_allows_when_there_are_none() -> None:
    policy, binding = placement_policy("sl-sandlot")
    assert policy["spec"]["paramKind"]["kind"] == "SandboxNode"
    ref = binding["spec"]["paramRef"]
    assert ref["selector"] == {"matchLabels": {TAINTED_LABEL: "true"}}
    assert ref["parameterNotFoundAction"] == "Allow"
    (validation,) = policy["spec"]["validations"]
    assert f"sl-sandlot-placement: rule {RULE}" in validation["messageExpression"]


def _node(
    taints: list[dict[str, str]] | None = None,
    mirrored: list[dict[str, str]] | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    labels = {} if label is None else {TAINTED_LABEL: label}
    return {
        "metadata": {"name": "n", "labels": labels},
        "spec": {"taints": taints or []},
        "status": {"nodeTaints": mirrored or []},
    }


NO_SCHEDULE = {"key": "k", "effect": "NoSchedule"}
NO_EXECUTE = {"key": "k", "effect": "NoExecute"}
PREFER = {"key": "k", "effect": "PreferNoSchedule"}


@pytest.mark.parametrize(
    ("node", "change"),
    [
        (_node(), None),
        (_node([NO_SCHEDULE]), {TAINTED_LABEL: "true"}),
        (_node(mirrored=[NO_EXECUTE]), {TAINTED_LABEL: "true"}),
        (_node([NO_SCHEDULE], label="true"), None),
        (_node([PREFER]), None),
        (_node([PREFER], label="true"), {TAINTED_LABEL: None}),
        (_node(label="true"), {TAINTED_LABEL: None}),
        (_node(label="false"), {TAINTED_LABEL: None}),
        (_node([NO_SCHEDULE], label="false"), {TAINTED_LABEL: "true"}),
    ],
    ids=[
        "untainted-unlabelled",
        "spec-taint-gets-label",
        "mirrored-taint-gets-label",
        "tainted-labelled",
        "prefer-no-schedule-is-no-taint",
        "prefer-no-schedule-loses-label",
        "untainted-loses-label",
        "other-value-removed",
        "other-value-corrected",
    ],
)
def test_tainted_label_follows_blocking_taints(
    node: dict[str, Any], change: dict[str, str | None] | None
) -> None:
    assert tainted_label(node) == change
