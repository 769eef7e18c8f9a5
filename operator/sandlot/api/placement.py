"""Placement vocabulary, shaped like Kubernetes' own: taints on SandboxNodes;
tolerations, a node selector and required node affinity on Sandboxes.

Control-plane nodes carry the taint ``node-role.kubernetes.io/control-plane``
(mirrored by their agent, or set by hand), so they get no sandboxes unless a
sandbox tolerates it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sandlot.api.common import MAX_DNS_LABEL, MAX_ENTRIES, MAX_NAME, Model

CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
LabelValue = Annotated[str, Field(max_length=MAX_DNS_LABEL)]


class Taint(Model):
    key: str = Field(min_length=1, max_length=317, description="Taint key.")
    value: str = Field(default="", max_length=MAX_DNS_LABEL, description="Taint value.")
    effect: TaintEffect = Field(
        description="NoSchedule and NoExecute keep sandboxes that do not tolerate the "
        "taint off the node; PreferNoSchedule is a hint the scheduler ignores."
    )


class Toleration(Model):
    key: str = Field(
        default="", max_length=317, description="Taint key; empty with Exists: every taint."
    )
    operator: Literal["Equal", "Exists"] = Field(
        default="Equal", description="Equal matches key and value; Exists the key alone."
    )
    value: str = Field(default="", max_length=MAX_DNS_LABEL, description="Value for Equal.")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="", description="Effect matched; empty: every effect."
    )


class NodeSelectorRequirement(Model):
    key: str = Field(min_length=1, max_length=317, description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the label's value is compared with values."
    )
    values: list[LabelValue] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="Values compared."
    )


class NodeSelectorTerm(Model):
    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        description="All must hold for the term to match.",
    )


class NodeSelector(Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=MAX_ENTRIES, description="Any one term matching suffices."
    )


class NodeAffinity(Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="The node's labels must match."
    )


class Affinity(Model):
    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")


Tolerations = Annotated[list[Toleration], Field(max_length=MAX_ENTRIES)]
Taints = Annotated[list[Taint], Field(max_length=MAX_ENTRIES)]
NodeLabels = Annotated[dict[str, LabelValue], Field(max_length=MAX_ENTRIES)]

__all__ = [
    "CONTROL_PLANE_TAINT",
    "MAX_NAME",
    "Affinity",
    "NodeAffinity",
    "NodeLabels",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "Taint",
    "Taints",
    "Toleration",
    "Tolerations",
]
