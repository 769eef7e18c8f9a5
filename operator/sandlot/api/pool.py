"""SandboxPool: keeps N live sandboxes from a template and replaces dead ones.

Shaped like a Deployment: ``spec.template`` has ``metadata`` and a Sandbox
``spec``, and the scale subresource makes ``kubectl scale sbpool/x`` work.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sandlot.api.common import (
    MAX_CONDITIONS,
    MAX_DNS_LABEL,
    MAX_ENTRIES,
    MAX_MESSAGE,
    Condition,
    CrdInfo,
    Model,
    PrinterColumn,
    Resource,
)
from sandlot.api.sandbox import SandboxSpec


class TemplateMetadata(Model):
    labels: dict[str, Annotated[str, Field(max_length=MAX_DNS_LABEL)]] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="Labels of each member."
    )
    annotations: dict[str, Annotated[str, Field(max_length=MAX_MESSAGE)]] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="Annotations of each member."
    )


class SandboxTemplate(Model):
    metadata: TemplateMetadata = Field(
        default_factory=TemplateMetadata, description="Metadata given to each member."
    )
    spec: SandboxSpec = Field(description="Sandbox spec of each member.")


class SandboxPoolSpec(Model):
    replicas: int = Field(default=1, ge=0, description="How many live members to keep.")
    template: SandboxTemplate = Field(description="What each member looks like.")
    service_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
        description="When set, the pool owns a Service of this name (no selector) and an "
        "EndpointSlice listing its Running members.",
    )
    history_limit: int = Field(
        default=10,
        ge=0,
        description="Terminal members kept for inspection before they are deleted.",
    )


class SandboxPoolStatus(Model):
    replicas: int = Field(default=0, description="Desired members (mirrors spec.replicas).")
    running: int = Field(default=0, description="Members Running.")
    pending: int = Field(default=0, description="Members Pending or Scheduled.")
    dead: int = Field(default=0, description="Terminal members still kept (Dead/Stopped/Failed).")
    selector: str = Field(
        default="",
        max_length=MAX_MESSAGE,
        description="Label selector of the members (for scale).",
    )
    observed_generation: int | None = Field(default=None, description="Generation seen.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=MAX_CONDITIONS, description="Conditions."
    )


class SandboxPool(Resource):
    crd = CrdInfo(
        kind="SandboxPool",
        plural="sandboxpools",
        singular="sandboxpool",
        scope="Namespaced",
        short_names=("sbpool",),
        columns=(
            PrinterColumn("Desired", ".spec.replicas", "integer"),
            PrinterColumn("Running", ".status.running", "integer"),
            PrinterColumn("Pending", ".status.pending", "integer"),
            PrinterColumn("Dead", ".status.dead", "integer"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
            PrinterColumn("Service", ".spec.serviceName", priority=1),
        ),
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    )

    kind: str = "SandboxPool"
    spec: SandboxPoolSpec
    status: SandboxPoolStatus | None = None
