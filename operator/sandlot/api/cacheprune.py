"""CachePrune: an operator's request to prune nodes' containerd image cache, and
its result per node.

``spec.all`` asks for the forced pass (every unprotected image, pressure or not);
without it the node runs its ordinary watermark pass now. Results are a map keyed
by node name, so each agent merge-patches its own entry without racing the others.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from sandlot.api.common import (
    AGE_COLUMN,
    CACHEPRUNES,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_NODES,
    CrdInfo,
    Model,
    PrinterColumn,
    Resource,
)
from sandlot.api.node import HeldBackBytes


class CachePrunePhase(StrEnum):
    """``status.phase`` of a CachePrune."""

    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"


class CachePruneSpec(Model):
    target: Literal["containerd"] = Field(
        default="containerd", description="Which cache to prune. Only `containerd` exists."
    )
    all: bool = Field(
        default=False,
        description="Run the forced pass: evict every image that is not in use, pinned or "
        "a live job's, whatever the disk usage. Without it the watermark pass runs now.",
    )
    nodes: list[Annotated[str, Field(max_length=MAX_NAME)]] = Field(
        default_factory=list,
        max_length=MAX_NODES,
        description="Nodes to prune; empty means every SandboxNode.",
    )


class NodePruneResult(Model):
    pass_kind: Literal["watermark", "forced"] | None = Field(
        default=None, alias="pass", description="The pass that ran (or would have run)."
    )
    records_removed: int = Field(default=0, description="Image records removed.")
    bytes_freed: int = Field(default=0, description="Bytes freed, measured on the filesystem.")
    held_back: HeldBackBytes = Field(
        default_factory=HeldBackBytes, description="What the pass kept, by reason."
    )
    error: str | None = Field(
        default=None, max_length=MAX_MESSAGE, description="Why the pass failed or did not run."
    )
    completed_at: datetime | None = Field(default=None, description="When the result was written.")


class CachePruneStatus(Model):
    phase: CachePrunePhase = Field(
        default=CachePrunePhase.PENDING,
        description="Complete when every targeted node reported without error; Failed when "
        "any reported an error.",
    )
    targets: list[Annotated[str, Field(max_length=MAX_NAME)]] = Field(
        default_factory=list, max_length=MAX_NODES, description="Nodes the request covers."
    )
    results: dict[str, NodePruneResult] = Field(
        default_factory=dict, max_length=MAX_NODES, description="Result per node name."
    )


class CachePrune(Resource):
    crd = CrdInfo(
        kind="CachePrune",
        plural=CACHEPRUNES,
        scope="Cluster",
        columns=(
            PrinterColumn("Target", ".spec.target"),
            PrinterColumn("All", ".spec.all", "boolean"),
            PrinterColumn("Phase", ".status.phase"),
            AGE_COLUMN,
        ),
    )

    kind: str = "CachePrune"
    spec: CachePruneSpec = Field(default_factory=CachePruneSpec)
    status: CachePruneStatus | None = None
