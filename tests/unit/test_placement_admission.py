"""The placement admission policy as data (the chart's copy), and what the operator
keeps on each SandboxNode for it: the label that tells it which SandboxNodes to
evaluate and the taints it reads, from what no agent writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandlot.api.keys import TAINTED_LABEL
from sandlot.api.placement import Taint
from sandlot.api.placementpolicy import CHART_TEMPLATE, RULE, chart_template, placement_policy
from sandlot.policy.nodetrust import AdmissionMarks, KubeNodeFacts, admission_marks, kube_node_facts

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
    trusted: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    labels = {} if label is None else {TAINTED_LABEL: label}
    return {
        "metadata": {"name": "n", "labels": labels},
        "spec": {"taints": taints or []},
        "status": {"nodeTaints": mirrored or [], "trustedNodeTaints": trusted or []},
    }


NO_SCHEDULE = {"key": "k", "effect": "NoSchedule"}
NO_EXECUTE = {"key": "k", "effect": "NoExecute"}
PREFER = {"key": "k", "effect": "PreferNoSchedule"}
TENANT = {"key": "tenant", "value": "b", "effect": "NoSchedule"}


def _kube(*taints: dict[str, str]) -> KubeNodeFacts:
    return kube_node_facts({"metadata": {"name": "n"}, "spec": {"taints": list(taints)}})


def _marks(
    trusted: list[dict[str, str]] | None = None, label: dict[str, str | None] | None = None
) -> AdmissionMarks:
    copied = None if trusted is None else tuple(Taint.model_validate(t) for t in trusted)
    return AdmissionMarks(copied, label)


LABEL: dict[str, str | None] = {TAINTED_LABEL: "true"}
UNLABEL: dict[str, str | None] = {TAINTED_LABEL: None}


@pytest.mark.parametrize(
    ("node", "kube", "marks"),
    [
        (_node(), None, None),
        (_node(), _kube(), None),
        (_node([NO_SCHEDULE]), None, _marks(label=LABEL)),
        (_node([NO_SCHEDULE], label="true"), _kube(), None),
        (_node([PREFER]), _kube(PREFER), None),
        (_node([PREFER], label="true"), None, _marks(label=UNLABEL)),
        (_node(label="true"), None, _marks(label=UNLABEL)),
        (_node(label="false"), None, _marks(label=UNLABEL)),
        (_node([NO_SCHEDULE], label="false"), None, _marks(label=LABEL)),
        (_node(), _kube(TENANT), _marks([TENANT], LABEL)),
        (_node(mirrored=[TENANT]), _kube(TENANT), _marks([TENANT], LABEL)),
        (_node(label="true", trusted=[TENANT]), _kube(TENANT), None),
        (_node(label="true", trusted=[TENANT]), _kube(), _marks([], UNLABEL)),
        (_node([NO_SCHEDULE], label="true", trusted=[TENANT]), _kube(), _marks([])),
        (_node(mirrored=[TENANT]), _kube(), None),
        (_node(mirrored=[NO_EXECUTE]), None, _marks([NO_EXECUTE], LABEL)),
        (_node(label="true", trusted=[NO_EXECUTE]), None, _marks([], UNLABEL)),
        (_node(), _kube({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}), None),
        (_node(label="true"), _kube(TENANT), _marks([TENANT])),
    ],
    ids=[
        "untainted-no-node",
        "untainted-node",
        "spec-taint-gets-label",
        "spec-taint-labelled",
        "prefer-no-schedule-is-no-taint",
        "prefer-no-schedule-loses-label",
        "untainted-loses-label",
        "other-value-removed",
        "other-value-corrected",
        "the-nodes-taint-copied-though-the-agent-mirrors-none",
        "the-nodes-taint-copied-as-the-agent-mirrors-it",
        "cleared-mirror-changes-nothing-while-the-node-is-tainted",
        "the-nodes-taint-removed-copy-and-label-go",
        "spec-taint-keeps-the-label-when-the-nodes-goes",
        "the-mirror-is-ignored-while-a-node-exists",
        "without-a-node-the-mirror-is-copied",
        "without-a-node-a-cleared-mirror-clears-the-copy",
        "condition-taints-are-not-copied",
        "labelled-but-not-yet-copied",
    ],
)
def test_admission_marks_follow_the_taints_no_agent_writes(
    node: dict[str, Any], kube: KubeNodeFacts | None, marks: AdmissionMarks | None
) -> None:
    assert admission_marks(node, kube) == marks
