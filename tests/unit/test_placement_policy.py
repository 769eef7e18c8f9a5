"""Placement: taints and tolerations, node selectors and required node affinity,
with Kubernetes' semantics, and the scheduler's choice over them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sandlot.api.node import NodePhase
from sandlot.api.placement import CONTROL_PLANE_TAINT, Taint, Toleration
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.placement import Placement, misfit, taints_of, tolerates
from sandlot.policy.scheduling import NodeSlot, SandboxRequest, Unschedulable, choose_node

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CP = Taint(key=CONTROL_PLANE_TAINT, effect="NoSchedule")


def placement(**spec: Any) -> Placement | None:
    return Placement.from_body(spec)


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (
            Toleration(key="k", value="v", effect="NoSchedule"),
            Taint(key="k", value="v", effect="NoSchedule"),
            True,
        ),
        (Toleration(key="k", value="w"), Taint(key="k", value="v", effect="NoSchedule"), False),
        (
            Toleration(key="k", operator="Exists"),
            Taint(key="k", value="v", effect="NoExecute"),
            True,
        ),
        (Toleration(operator="Exists"), CP, True),
        (
            Toleration(key="k", operator="Exists", effect="NoExecute"),
            Taint(key="k", effect="NoSchedule"),
            False,
        ),
        (Toleration(key=CONTROL_PLANE_TAINT, operator="Exists", effect="NoSchedule"), CP, True),
    ],
    ids=[
        "equal",
        "other value",
        "exists any effect",
        "exists no key: everything",
        "other effect",
        "control plane",
    ],
)
def test_tolerates(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert tolerates(toleration, taint) is tolerated


@pytest.mark.parametrize(
    ("spec", "labels", "taints", "why"),
    [
        ({}, {}, [], None),
        ({}, {}, [CP], "untolerated taint {node-role.kubernetes.io/control-plane:NoSchedule}"),
        ({}, {}, [Taint(key="x", effect="PreferNoSchedule")], None),
        ({"tolerations": [{"key": CONTROL_PLANE_TAINT, "operator": "Exists"}]}, {}, [CP], None),
        ({"nodeSelector": {"disk": "ssd"}}, {"disk": "ssd", "zone": "a"}, [], None),
        ({"nodeSelector": {"disk": "ssd"}}, {"disk": "hdd"}, [], "node selector does not match"),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "zone", "operator": "In", "values": ["b"]}
                                    ]
                                },
                                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                            ]
                        }
                    }
                }
            },
            {"zone": "a", "gpu": "1"},
            [],
            None,
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "zone", "operator": "NotIn", "values": ["a"]},
                                        {"key": "cores", "operator": "Gt", "values": ["4"]},
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            {"zone": "b", "cores": "4"},
            [],
            "node affinity does not match",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "spot", "operator": "DoesNotExist"},
                                        {"key": "cores", "operator": "Lt", "values": ["8"]},
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            {"cores": "4"},
            [],
            None,
        ),
    ],
    ids=[
        "nothing asked, nothing tainted",
        "control-plane taint keeps it off",
        "PreferNoSchedule does not",
        "tolerated control plane",
        "selector matches",
        "selector mismatch",
        "affinity: any term",
        "affinity: every expression of a term",
        "affinity: DoesNotExist and Lt",
    ],
)
def test_misfit(
    spec: dict[str, Any], labels: dict[str, str], taints: list[Taint], why: str | None
) -> None:
    assert misfit(placement(**spec), labels, taints) == why


def test_no_constraints_costs_no_record() -> None:
    assert Placement.from_body({"image": "x", "command": ["sh"]}) is None
    spec = SandboxSpec.model_validate({"image": "x", "nodeSelector": {"a": "b"}})
    assert Placement.of(spec).node_selector == (("a", "b"),)


def test_node_taints_are_its_own_and_its_kubernetes_nodes() -> None:
    node = {
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
        "status": {"nodeTaints": [{"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}]},
    }
    assert [t.key for t in taints_of(node)] == ["a", CONTROL_PLANE_TAINT]


def slot(
    name: str,
    *,
    taints: tuple[Taint, ...] = (),
    labels: dict[str, str] | None = None,
    sandboxes: int = 0,
) -> NodeSlot:
    return NodeSlot(name, NodePhase.READY, False, 10, sandboxes, labels=labels or {}, taints=taints)


@pytest.mark.parametrize(
    ("spec", "nodes", "chosen", "reason", "words"),
    [
        ({}, [slot("cp", taints=(CP,)), slot("w", sandboxes=5)], "w", None, ""),
        (
            {},
            [slot("cp", taints=(CP,))],
            None,
            Unschedulable.NO_MATCHING_NODE,
            "0/1 nodes are available: 1 untolerated taint or node selector/affinity mismatch",
        ),
        (
            {"tolerations": [{"key": CONTROL_PLANE_TAINT, "operator": "Exists"}]},
            [slot("cp", taints=(CP,)), slot("w", sandboxes=5)],
            "cp",
            None,
            "",
        ),
        (
            {"nodeSelector": {"pool": "gpu"}},
            [slot("a"), slot("g", labels={"pool": "gpu"}, sandboxes=9)],
            "g",
            None,
            "",
        ),
        (
            {"nodeSelector": {"pool": "gpu"}},
            [slot("a"), slot("g", labels={"pool": "gpu"}, sandboxes=10)],
            None,
            Unschedulable.ALL_AT_CAPACITY,
            "1 untolerated taint or node selector/affinity mismatch, 1 at capacity",
        ),
    ],
    ids=[
        "control plane skipped",
        "only a control plane: says why",
        "tolerated: least loaded wins",
        "selector narrows the choice",
        "selected node full",
    ],
)
def test_scheduler_honours_placement(
    spec: dict[str, Any],
    nodes: list[NodeSlot],
    chosen: str | None,
    reason: Unschedulable | None,
    words: str,
) -> None:
    choice = choose_node(SandboxRequest("ns/sb", None, placement(**spec)), nodes, NOW)
    assert choice.node == chosen
    assert choice.reason == reason
    assert words in choice.message
