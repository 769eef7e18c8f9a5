"""Whether a sandbox may go to a node: taints and tolerations, node selector and
required node affinity, with Kubernetes' semantics. Pure.

- a NoSchedule or NoExecute taint keeps a sandbox off unless one of its
  tolerations matches it (PreferNoSchedule is a preference the scheduler does not
  weigh); a toleration with operator Exists and no key matches every taint;
- every ``nodeSelector`` pair must be one of the node's labels;
- of the required affinity's terms any one must match, and within a term every
  expression (In, NotIn, Exists, DoesNotExist, Gt, Lt).

The answer is a reason in ``kubectl describe``'s words, or None when it fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandlot.api.placement import (
    Affinity,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Taint,
    Toleration,
)
from sandlot.api.sandbox import SandboxSpec

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Placement:
    """A sandbox's placement constraints."""

    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: Affinity | None = None

    @classmethod
    def of(cls, spec: SandboxSpec) -> Placement:
        return cls(
            tuple(spec.tolerations), tuple(sorted(spec.node_selector.items())), spec.affinity
        )

    @classmethod
    def from_body(cls, spec: Mapping[str, Any]) -> Placement | None:
        """None for a spec with no constraints (the common case costs nothing)."""
        if not (spec.get("tolerations") or spec.get("nodeSelector") or spec.get("affinity")):
            return None
        parsed = SandboxSpec.model_validate(
            {
                "image": "-",
                **{k: spec[k] for k in ("tolerations", "nodeSelector", "affinity") if k in spec},
            }
        )
        return cls.of(parsed)


def taints_of(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A SandboxNode's taints: its own (spec) and its Kubernetes Node's (status)."""
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    return tuple(
        Taint.model_validate(t)
        for t in [*(spec.get("taints") or []), *(status.get("nodeTaints") or [])]
    )


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


def untolerated(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> list[Taint]:
    """The blocking taints none of ``tolerations`` matches."""
    return [
        t
        for t in taints
        if t.effect in BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tolerations)
    ]


def _number(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _holds(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = req.key in labels
    value = labels.get(req.key, "")
    if req.operator == "In":
        return present and value in req.values
    if req.operator == "NotIn":
        return not present or value not in req.values
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return not present
    have, bound = _number(value), _number(req.values[0]) if len(req.values) == 1 else None
    if not present or have is None or bound is None:
        return False
    return have > bound if req.operator == "Gt" else have < bound


def _term_matches(term: NodeSelectorTerm, labels: Mapping[str, str]) -> bool:
    return bool(term.match_expressions) and all(_holds(r, labels) for r in term.match_expressions)


def affinity_matches(affinity: Affinity | None, labels: Mapping[str, str]) -> bool:
    node = affinity.node_affinity if affinity else None
    required = node.required_during_scheduling_ignored_during_execution if node else None
    if required is None:
        return True
    return any(_term_matches(t, labels) for t in required.node_selector_terms)


def _taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


def misfit(
    placement: Placement | None, labels: Mapping[str, str], taints: Sequence[Taint]
) -> str | None:
    """Why a sandbox with ``placement`` may not run on a node with ``labels`` and
    ``taints``; None if it may."""
    spec = placement or Placement()
    blocking = untolerated(taints, spec.tolerations)
    if blocking:
        return "untolerated taint {" + ", ".join(_taint_text(t) for t in blocking) + "}"
    if any(labels.get(k) != v for k, v in spec.node_selector):
        return "node selector does not match"
    if not affinity_matches(spec.affinity, labels):
        return "node affinity does not match"
    return None


__all__ = [
    "Placement",
    "affinity_matches",
    "misfit",
    "taints_of",
    "tolerates",
    "untolerated",
]
