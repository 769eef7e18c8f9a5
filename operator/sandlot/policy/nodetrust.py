"""What placement believes about a node: only what the node itself cannot widen. Pure.

A node's agent writes its SandboxNode's status, so a compromised node could clear
the taints it mirrors there (``status.nodeTaints``) and advertise any runtime
handler (``status.runtimeHandlers``) to draw other tenants' sandboxes, their
secrets and their private images. Placement therefore reads:

- **taints** from the SandboxNode's ``spec.taints`` (the admins') and the Kubernetes
  Node's ``spec.taints`` (the kubelet's and the admins'; no agent writes a Node),
  less the node lifecycle's condition taints (``node.kubernetes.io/...``: the
  kubelet's health; sandlot judges health by its agent's Lease).
  The agent's mirror counts only for a SandboxNode with no Kubernetes Node at all
  (a fleet without kubelets); an agent cannot make its own Node disappear, since it
  may write only the SandboxNode of the node its token names;
- **runtime handlers**: ``runc`` (containerd's default, on every node) when the
  node offers it; any other handler only when the node offers it *and* something
  the node cannot write confirms it: the Node's ``sandlot.dev/runtime-handlers``
  label lists it, or the RuntimeClass's ``scheduling.nodeSelector`` is non-empty and
  the Node's labels match it. Without a Node, no other handler is trusted.

A node's own writes can still narrow placement (an offered handler it drops, an
extra mirrored taint with no Node); they never widen it.

The placement admission policy cannot read a Node, only SandboxNodes: the operator
copies the taints placement trusts into ``status.trustedNodeTaints`` and keeps the
label that selects the node for the policy (``admission_marks``); the agent's write
policy keeps the agent off both (``sandlot.api.writepolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandlot.api.keys import RUNTIME_HANDLERS_LABEL, TAINTED_LABEL
from sandlot.api.placement import Taint
from sandlot.policy.placement import BLOCKING_EFFECTS
from sandlot.policy.runtimeclass import RUNC

CONDITION_TAINTS = "node.kubernetes.io/"


@dataclass(frozen=True)
class KubeNodeFacts:
    """What the operator read from a Kubernetes Node: its labels and taints."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


def kube_node_facts(body: Mapping[str, Any]) -> KubeNodeFacts:
    """The facts of a Node as the API server's JSON."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return KubeNodeFacts(
        labels=dict(meta.get("labels") or {}),
        taints=tuple(
            Taint.model_validate(
                {"key": t["key"], "value": t.get("value") or "", "effect": t["effect"]}
            )
            for t in spec.get("taints") or ()
            if t.get("key") and t.get("effect") and not t["key"].startswith(CONDITION_TAINTS)
        ),
    )


def trusted_taints(
    own: Sequence[Taint], mirrored: Sequence[Taint], kube: KubeNodeFacts | None
) -> tuple[Taint, ...]:
    """The taints placement honours: the SandboxNode's ``spec.taints`` (``own``) and
    its Kubernetes Node's; the agent's ``status.nodeTaints`` (``mirrored``) only when
    there is no Node."""
    return (*own, *(kube.taints if kube is not None else mirrored))


@dataclass(frozen=True)
class AdmissionMarks:
    """What the operator writes on a SandboxNode for the placement admission policy;
    a part left None is right as it is."""

    trusted_taints: tuple[Taint, ...] | None = None
    """The new ``status.trustedNodeTaints``."""
    label: dict[str, str | None] | None = None
    """The change of ``TAINTED_LABEL``: ``"true"`` to set it, None to remove it."""


def _taints(raw: Any) -> tuple[Taint, ...]:
    return tuple(Taint.model_validate(t) for t in raw or ())


def admission_marks(node: Mapping[str, Any], kube: KubeNodeFacts | None) -> AdmissionMarks | None:
    """What keeps SandboxNode ``node`` (the API server's JSON) right for the placement
    admission policy, given its Kubernetes Node (None: there is none); None when
    nothing is to be written. ``status.trustedNodeTaints`` holds the Node's blocking
    taints (the mirror's where there is no Node), and the node is labelled when they
    or ``spec.taints`` hold one: the policy evaluates only the labelled nodes."""
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    blocking = tuple(
        t
        for t in trusted_taints((), _taints(status.get("nodeTaints")), kube)
        if t.effect in BLOCKING_EFFECTS
    )
    wanted = bool(blocking) or any(
        t.effect in BLOCKING_EFFECTS for t in _taints(spec.get("taints"))
    )
    labels = (node.get("metadata") or {}).get("labels") or {}
    as_wanted = (labels.get(TAINTED_LABEL) == "true") == wanted and (
        wanted or TAINTED_LABEL not in labels
    )
    label = None if as_wanted else {TAINTED_LABEL: "true" if wanted else None}
    taints = None if _taints(status.get("trustedNodeTaints")) == blocking else blocking
    if label is None and taints is None:
        return None
    return AdmissionMarks(taints, label)


def class_selector_holds(
    selector: Sequence[tuple[str, str]], own: Mapping[str, str], kube: KubeNodeFacts | None
) -> bool:
    """Whether a RuntimeClass's ``scheduling.nodeSelector`` admits this node: matched
    against the Kubernetes Node's labels (what it means in Kubernetes, and what no
    agent writes); against the SandboxNode's own only where no Node of that name
    exists."""
    labels = kube.labels if kube is not None else own
    return all(labels.get(k) == v for k, v in selector)


def confirmed_handlers(kube: KubeNodeFacts | None) -> frozenset[str]:
    """The handlers the Node's admin-set label lists."""
    if kube is None:
        return frozenset()
    value = kube.labels.get(RUNTIME_HANDLERS_LABEL, "")
    return frozenset(h for h in value.split(".") if h)


def trusted_handlers(
    offered: frozenset[str],
    kube: KubeNodeFacts | None,
    class_selector: Sequence[tuple[str, str]] = (),
) -> frozenset[str]:
    """The handlers placement may send a sandbox to this node for: of those the node
    ``offered``, ``runc`` and the ones confirmed by the Node (its label, or the
    RuntimeClass's non-empty ``class_selector`` matching its labels)."""
    trusted = {RUNC} | confirmed_handlers(kube)
    if (
        kube is not None
        and class_selector
        and all(kube.labels.get(k) == v for k, v in class_selector)
    ):
        return offered
    return offered & trusted


__all__ = [
    "CONDITION_TAINTS",
    "AdmissionMarks",
    "KubeNodeFacts",
    "admission_marks",
    "class_selector_holds",
    "confirmed_handlers",
    "kube_node_facts",
    "trusted_handlers",
    "trusted_taints",
]
