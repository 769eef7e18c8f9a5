"""The operator's marks for the placement admission policy
(``sandlot.controllers.taintlabels``) over an in-memory API: what it writes from a
SandboxNode's event and from its Kubernetes Node's, and when it holds back."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

from sandlot.api.keys import TAINTED_LABEL
from sandlot.controllers.taintlabels import KubeNodeView, TaintMarks
from sandlot.policy.nodetrust import KubeNodeFacts, kube_node_facts
from tests.support.fakeobjects import FakeObjects

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TENANT = {"key": "tenant", "value": "b", "effect": "NoSchedule"}


def _kube_node(*taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "spec": {"taints": list(taints)}}


class World:
    def __init__(self) -> None:
        self.objects = FakeObjects(lambda: T0)
        self.kube_nodes: dict[str, KubeNodeFacts] = {}  # the scheduler's view
        self.listed = False
        self.marks = TaintMarks(
            self.objects,  # type: ignore[arg-type]
            KubeNodeView(self.kube_nodes.get, lambda: self.listed),
            self.objects.nodes,
        )
        self.objects.add_node("n", T0)

    @property
    def node(self) -> dict[str, Any]:
        return self.objects.nodes["n"]

    def marked(self) -> tuple[str | None, Any]:
        """The node's label and its ``status.trustedNodeTaints``."""
        labels = self.node["metadata"].get("labels") or {}
        return labels.get(TAINTED_LABEL), self.node["status"].get("trustedNodeTaints")


def _run(step: Coroutine[Any, Any, bool]) -> bool:
    return asyncio.run(step)


def test_a_node_event_decides_nothing_before_the_kubernetes_nodes_are_listed() -> None:
    """Marked by an earlier leader, its agent's mirror cleared: a Node not yet seen
    would read as none, the cleared mirror as the truth, and the marks would go."""
    w = World()
    w.node["metadata"]["labels"] = {TAINTED_LABEL: "true"}
    w.node["status"] = {"nodeTaints": [], "trustedNodeTaints": [TENANT]}
    assert not _run(w.marks.sync(w.node))
    assert w.objects.writes == []
    w.kube_nodes["n"] = kube_node_facts(_kube_node(TENANT))
    w.listed = True
    assert not _run(w.marks.sync(w.node))
    assert w.objects.writes == [] and w.marked() == ("true", [TENANT])


def test_the_kubernetes_nodes_taint_is_copied_then_labelled_from_its_own_event() -> None:
    w = World()
    w.node["status"] = {"nodeTaints": []}
    assert _run(w.marks.on_kube_node("ADDED", _kube_node(TENANT)))
    assert w.marked() == ("true", [TENANT])
    assert w.objects.writes == [("patch-node-status", "n"), ("patch-node-labels", "n")]
    assert not _run(w.marks.on_kube_node("MODIFIED", _kube_node(TENANT)))  # nothing new
    # The Node gone, the mirror is all there is: empty here, so both marks go.
    assert _run(w.marks.on_kube_node("DELETED", _kube_node(TENANT)))
    assert w.marked() == (None, [])


def test_a_sandboxnode_event_copies_from_the_schedulers_view_of_its_node() -> None:
    w = World()
    w.listed = True
    w.kube_nodes["n"] = kube_node_facts(_kube_node(TENANT))
    w.node["status"] = {"nodeTaints": []}
    assert _run(w.marks.sync(w.node))
    assert w.marked() == ("true", [TENANT])


def test_a_decision_on_an_old_version_writes_nothing_more() -> None:
    w = World()
    w.listed = True
    w.kube_nodes["n"] = kube_node_facts(_kube_node(TENANT))
    old = {**w.node, "metadata": dict(w.node["metadata"])}
    w.objects.patch_node_status("n", {"address": "10.0.0.1"})  # a newer version
    assert not _run(w.marks.sync(old))
    assert w.objects.writes == [("patch-node-status", "n"), ("patch-node-status", "n")]
    assert w.marked() == (None, None)
