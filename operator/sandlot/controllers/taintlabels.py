"""Keeps on each SandboxNode what the placement admission policy reads: the label
``sandlot.dev/tainted`` that selects it, and ``status.trustedNodeTaints``.

The policy (``sandlot.api.placementpolicy``) can read neither the Kubernetes Node nor
anything but SandboxNodes selected by label, and a node's agent writes its
SandboxNode's status: a compromised node could clear the taints it mirrors
(``status.nodeTaints``). So the operator copies the taints placement trusts (the
Node's, less its condition taints; the mirror only where no Node exists:
``policy.nodetrust.admission_marks``) into a field the agent's write policy keeps it
off, and labels the node from those and ``spec.taints``.

Each SandboxNode event decides with the scheduler's view of the Nodes, once that
view holds the first complete list (before, a Node not yet seen would read as none);
each Node event decides for the SandboxNode of its name with the Node as the event
has it. A decision is applied with the resourceVersion it was made on (a 409: a newer
event decides again). Only the leader writes. A new leader missed the events of its
predecessor's term: the node resync timer (``controllers.kopfwiring``, one timer per
node for every controller) calls ``sync`` too.

Decisions run on the event loop: they are pure and almost always "nothing to do",
so only a write goes to a thread (kopf would run a plain function in its executor
for every event and every tick, 5,000 thread hand-offs a resync at 5,000 nodes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from sandlot.adapters.objects import Objects
from sandlot.api.common import GROUP, KUBE_NODES, NODES, VERSION
from sandlot.policy.nodetrust import AdmissionMarks, KubeNodeFacts, admission_marks, kube_node_facts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubeNodeView:
    """The operator's watch of the Kubernetes Nodes (the scheduler's)."""

    facts: Callable[[str], KubeNodeFacts | None]
    """The Node of that name, None when there is none."""
    listed: Callable[[], bool]
    """Whether the first complete list is in (until then ``facts`` may miss a Node)."""


def apply_marks(objects: Objects, body: Mapping[str, Any], marks: AdmissionMarks) -> bool:
    """Write ``marks`` on SandboxNode ``body`` as of its version; True if all written."""
    meta = body["metadata"]
    name, version = meta["name"], str(meta["resourceVersion"])
    if marks.trusted_taints is not None:
        taints = [t.wire() for t in marks.trusted_taints]
        written = objects.patch_node_status_as_of(name, {"trustedNodeTaints": taints}, version)
        if written is None:
            return False
        version = written
        log.info("SandboxNode %s: trusted node taints %s", name, taints)
    if marks.label is not None:
        if not objects.patch_node_labels(name, marks.label, version):
            return False
        log.info("SandboxNode %s: label %s", name, marks.label)
    return True


class TaintMarks:
    """The leader's marks for the placement policy, decided per SandboxNode."""

    def __init__(
        self,
        objects: Objects,
        kube: KubeNodeView,
        nodes: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """``nodes``: the SandboxNodes by name as last seen (node health's cache)."""
        self.objects = objects
        self.kube = kube
        self.nodes = nodes

    async def _apply(self, body: Mapping[str, Any], marks: AdmissionMarks | None) -> bool:
        if marks is None:
            return False
        return await asyncio.to_thread(apply_marks, self.objects, body, marks)

    async def sync(self, body: Mapping[str, Any]) -> bool:
        """Decide for SandboxNode ``body`` on the loop, write (if anything) in a thread."""
        if not self.kube.listed():
            return False
        return await self._apply(
            body, admission_marks(body, self.kube.facts(body["metadata"]["name"]))
        )

    async def on_kube_node(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """A Kubernetes Node's event: decide again for its SandboxNode, if one is known."""
        node = self.nodes.get(body["metadata"]["name"])
        if node is None:
            return False
        kube = None if event_type == "DELETED" else kube_node_facts(body)
        return await self._apply(node, admission_marks(node, kube))

    def register(self, registry: kopf.OperatorRegistry, leading: Callable[[], bool]) -> None:
        @kopf.on.event(GROUP, VERSION, NODES, registry=registry)
        async def node_taints(body: kopf.Body, **kwargs: Any) -> None:
            if kwargs.get("type") == "DELETED" or not leading():
                return
            await self.sync(body)

        @kopf.on.event("", "v1", KUBE_NODES, registry=registry)
        async def kube_node_taints(body: kopf.Body, **kwargs: Any) -> None:
            if leading():
                await self.on_kube_node(kwargs.get("type"), body)


__all__ = ["KubeNodeView", "TaintMarks", "apply_marks"]
