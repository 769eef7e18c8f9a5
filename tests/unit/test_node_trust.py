"""What placement believes about a node: a node's own writes never widen it."""

from __future__ import annotations

import pytest

from sandlot.api.keys import RUNTIME_HANDLERS_LABEL
from sandlot.api.placement import Taint
from sandlot.policy.nodetrust import (
    KubeNodeFacts,
    class_selector_holds,
    kube_node_facts,
    trusted_handlers,
    trusted_taints,
)
from sandlot.policy.placement import Placement, misfit

CP = Taint(key="node-role.kubernetes.io/control-plane", effect="NoSchedule")
TENANT = Taint(key="tenant", value="a", effect="NoSchedule")
SPOT = Taint(key="spot", effect="NoExecute")


@pytest.mark.parametrize(
    ("own", "mirrored", "kube", "wanted"),
    [
        ((), (), KubeNodeFacts(taints=(CP,)), (CP,)),
        ((), (), KubeNodeFacts(taints=(TENANT,)), (TENANT,)),
        ((SPOT,), (), KubeNodeFacts(taints=(CP,)), (SPOT, CP)),
        ((), (TENANT,), KubeNodeFacts(), ()),
        ((), (CP,), None, (CP,)),
        ((SPOT,), (), None, (SPOT,)),
    ],
    ids=[
        "the-nodes-taint-holds-though-the-agent-mirrors-none",
        "a-tenant-taint-on-the-node-holds-though-the-agent-mirrors-none",
        "admin-spec-taints-join-the-nodes",
        "the-mirror-is-ignored-while-a-node-exists",
        "without-a-node-the-mirror-is-all-there-is",
        "without-a-node-the-spec-taints-hold",
    ],
)
def test_taints_come_from_what_no_agent_writes(
    own: tuple[Taint, ...],
    mirrored: tuple[Taint, ...],
    kube: KubeNodeFacts | None,
    wanted: tuple[Taint, ...],
) -> None:
    assert trusted_taints(own, mirrored, kube) == wanted


def test_a_node_that_clears_its_mirrored_taints_still_refuses_an_untolerating_sandbox() -> None:
    kube = kube_node_facts(
        {"metadata": {"name": "n"}, "spec": {"taints": [{"key": "tenant", "effect": "NoSchedule"}]}}
    )
    taints = trusted_taints((), (), kube)
    assert misfit(Placement(), {}, taints) == "untolerated taint {tenant:NoSchedule}"


def test_the_node_lifecycles_condition_taints_are_left_out() -> None:
    kube = kube_node_facts(
        {
            "metadata": {"name": "n"},
            "spec": {
                "taints": [
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                    {"key": "tenant", "value": "a", "effect": "NoSchedule"},
                ]
            },
        }
    )
    assert kube.taints == (TENANT,)


def _labelled(value: str, **labels: str) -> KubeNodeFacts:
    return KubeNodeFacts(labels={RUNTIME_HANDLERS_LABEL: value, **labels})


@pytest.mark.parametrize(
    ("offered", "kube", "selector", "wanted"),
    [
        ({"runc", "gvisor"}, KubeNodeFacts(), (), {"runc"}),
        ({"runc", "gvisor"}, None, (), {"runc"}),
        ({"runc", "gvisor"}, _labelled("gvisor"), (), {"runc", "gvisor"}),
        ({"runc", "gvisor", "crun"}, _labelled("crun.gvisor"), (), {"runc", "gvisor", "crun"}),
        ({"runc"}, _labelled("gvisor"), (), {"runc"}),
        (
            {"runc", "gvisor"},
            KubeNodeFacts(labels={"rt": "gvisor"}),
            (("rt", "gvisor"),),
            {"runc", "gvisor"},
        ),
        ({"runc", "gvisor"}, KubeNodeFacts(labels={"rt": "runc"}), (("rt", "gvisor"),), {"runc"}),
        ({"runc", "gvisor"}, None, (("rt", "gvisor"),), {"runc"}),
        (set(), _labelled("gvisor"), (), set()),
    ],
    ids=[
        "an-unconfirmed-handler-is-refused",
        "without-a-node-only-runc",
        "the-nodes-admin-label-confirms-a-handler",
        "the-label-lists-several-handlers",
        "a-label-does-not-add-a-handler-the-node-lacks",
        "the-classes-selector-matching-the-nodes-labels-confirms",
        "a-selector-the-node-does-not-match-confirms-nothing",
        "a-selector-without-a-node-confirms-nothing",
        "nothing-offered-nothing-trusted",
    ],
)
def test_a_handler_other_than_runc_needs_the_nodes_confirmation(
    offered: set[str],
    kube: KubeNodeFacts | None,
    selector: tuple[tuple[str, str], ...],
    wanted: set[str],
) -> None:
    assert trusted_handlers(frozenset(offered), kube, selector) == frozenset(wanted)


@pytest.mark.parametrize(
    ("own", "kube", "holds"),
    [
        ({"disk": "ssd"}, None, True),
        ({}, None, False),
        ({}, KubeNodeFacts(labels={"disk": "ssd"}), True),
        ({"disk": "ssd"}, KubeNodeFacts(labels={}), False),
    ],
    ids=["no-node-its-own-labels", "no-node-no-label", "the-nodes-label", "agent-label-alone"],
)
def test_a_runtime_classs_selector_is_matched_against_the_kubernetes_node(
    own: dict[str, str], kube: KubeNodeFacts | None, holds: bool
) -> None:
    """A node's agent cannot label its SandboxNode into a RuntimeClass's selector the
    Node does not match; where no Node exists, its own labels are all there is."""
    assert class_selector_holds((("disk", "ssd"),), own, kube) is holds
