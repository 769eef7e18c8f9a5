"""SandboxPool: keeps N live sandboxes from a template and replaces dead ones.

Shaped like a Deployment: ``spec.template`` has ``metadata`` and a Sandbox
``spec``, and the scale subresource makes ``kubectl scale sbpool/x`` work.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import Field, field_validator
from pydantic.config import JsonDict

from sandlot.api.common import (
    AGE_COLUMN,
    MAX_DNS_LABEL,
    MAX_ENTRIES,
    MAX_MESSAGE,
    POOLS,
    Conditions,
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


_COUNT_OR_PERCENT: JsonDict = {
    "x-kubernetes-int-or-string": True,
    "x-kubernetes-validations": [
        {
            "rule": "type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",
            "message": "a count (1) or a percentage of replicas ('25%')",
        }
    ],
}


class RollingUpdate(Model):
    max_surge: int | str = Field(
        default="25%",
        json_schema_extra=_COUNT_OR_PERCENT,
        description="Members above `replicas` a rollout may add: a count or a percentage "
        "of replicas, rounded up.",
    )
    max_unavailable: int | str = Field(
        default="25%",
        json_schema_extra=_COUNT_OR_PERCENT,
        description="Members below `replicas` that may be not Running during a rollout: a "
        "count or a percentage of replicas, rounded down.",
    )

    @field_validator("max_surge", "max_unavailable")
    @classmethod
    def _count_or_percent(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 0:
                raise ValueError("must be >= 0")
            return value
        if not re.fullmatch(r"[0-9]+%", value):
            raise ValueError("a count (1) or a percentage of replicas ('25%')")
        return value


class PoolStrategy(Model):
    rolling_update: RollingUpdate = Field(
        default_factory=RollingUpdate,
        description="How a template change replaces members (as a Deployment's RollingUpdate).",
    )


# No pool may ask for more, whatever the operator allows (its pool_max_replicas).
MAX_POOL_REPLICAS = 100_000


class SandboxPoolSpec(Model):
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_POOL_REPLICAS,
        description="How many live members to keep (the operator's pool_max_replicas caps "
        "what it keeps).",
    )
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
    min_ready_seconds: int = Field(
        default=0,
        ge=0,
        le=86400,
        description="Seconds a member must have been Running, on a Ready node, before it "
        "counts as available in a rolling update (as a Deployment's minReadySeconds): a "
        "member that crashes soon after it starts never stands in for an old one.",
    )
    strategy: PoolStrategy = Field(
        default_factory=PoolStrategy,
        description="How members are replaced when the template changes: each member whose "
        "spec differs from the template is replaced, within maxSurge and maxUnavailable.",
    )


class SandboxPoolStatus(Model):
    replicas: int = Field(default=0, description="Desired members (mirrors spec.replicas).")
    capped_at: int | None = Field(
        default=None,
        description="Set when spec.replicas is over the operator's pool_max_replicas: the "
        "members it keeps instead.",
    )
    running: int = Field(default=0, description="Members Running.")
    pending: int = Field(default=0, description="Members Pending or Scheduled.")
    dead: int = Field(default=0, description="Terminal members still kept (Dead/Stopped/Failed).")
    updated_replicas: int = Field(
        default=0, description="Live members whose spec is the current template."
    )
    ready_replicas: int = Field(default=0, description="Members Running.")
    failed_in_a_row: int = Field(
        default=0,
        description="Members that failed one after another (Failed, or a non-zero exit); "
        "replacements back off while it is above zero.",
    )
    backoff_until: datetime | None = Field(
        default=None, description="Replacements wait until then (members keep failing)."
    )
    selector: str = Field(
        default="",
        max_length=MAX_MESSAGE,
        description="Label selector of the members (for scale).",
    )
    observed_generation: int | None = Field(default=None, description="Generation seen.")
    conditions: Conditions = Field(default_factory=list, description="Conditions.")


class SandboxPool(Resource):
    crd = CrdInfo(
        kind="SandboxPool",
        plural=POOLS,
        scope="Namespaced",
        short_names=("sbpool",),
        columns=(
            PrinterColumn("Desired", ".spec.replicas", "integer"),
            PrinterColumn("Running", ".status.running", "integer"),
            PrinterColumn("Up-To-Date", ".status.updatedReplicas", "integer"),
            PrinterColumn("Pending", ".status.pending", "integer"),
            PrinterColumn("Dead", ".status.dead", "integer"),
            AGE_COLUMN,
            PrinterColumn("Service", ".spec.serviceName", priority=1),
            PrinterColumn("Backoff-Until", ".status.backoffUntil", priority=1),
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
