"""SandboxClaim: a request for one ready sandbox from a pool, bound at once.

A claim names a SandboxPool in its namespace; the operator binds it to one of the
pool's Running members (a warm sandbox: no image pull, no start), which leaves the
pool (its ``sandlot.dev/pool`` label gives way to ``sandlot.dev/claim``, and the
claim becomes its owner), so the pool starts a replacement. The claim's status
names the sandbox and its address. Deleting the claim deletes its sandbox.

``spec.lifecycle`` ends a claim at ``shutdownTime``: ``Delete`` deletes the claim
and its sandbox; ``Retain`` (the default) stops the sandbox with reason
``ClaimExpired`` and moves the claim to the final phase ``Expired``. A ``Lost`` or
``Expired`` claim with ``ttlSecondsAfterFinished`` is deleted with its sandbox at
``status.finishedAt`` + TTL.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import AwareDatetime, Field

from sandlot.api.common import (
    AGE_COLUMN,
    CLAIMS,
    Condition,
    CrdInfo,
    Model,
    PrinterColumn,
    Resource,
)
from sandlot.api.sandbox import ShutdownPolicy


class ClaimPhase(StrEnum):
    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"
    EXPIRED = "Expired"


FINAL_CLAIM_PHASES: frozenset[str] = frozenset({ClaimPhase.LOST, ClaimPhase.EXPIRED})


class ClaimLifecycle(Model):
    shutdown_time: AwareDatetime | None = Field(
        default=None,
        description="When the claim ends (RFC 3339), on the operator's clock.",
    )
    shutdown_policy: ShutdownPolicy = Field(
        default=ShutdownPolicy.RETAIN,
        description="At shutdownTime: `Retain` (the default) stops the sandbox (reason "
        "ClaimExpired) and moves the claim to phase Expired; `Delete` deletes the claim "
        "and its sandbox.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Seconds a Lost or Expired claim is kept, counted from "
        "status.finishedAt; then it is deleted with its sandbox.",
    )


class SandboxClaimSpec(Model):
    pool_name: str = Field(
        min_length=1,
        max_length=253,
        description="The SandboxPool (in the claim's namespace) to take a Running member from.",
    )
    lifecycle: ClaimLifecycle | None = Field(
        default=None, description="When the claim ends, and what happens then."
    )


class SandboxClaimStatus(Model):
    phase: ClaimPhase = Field(
        default=ClaimPhase.PENDING,
        description="Pending (no Ready member yet), Bound, Lost (its sandbox ended or "
        "was deleted) or Expired (its lifecycle.shutdownTime passed under Retain).",
    )
    sandbox_name: str | None = Field(default=None, description="The sandbox bound to the claim.")
    address: str | None = Field(default=None, description="The sandbox's IP address.")
    node_name: str | None = Field(default=None, description="The node it runs on.")
    bound_at: datetime | None = Field(default=None, description="When the claim was bound.")
    message: str | None = Field(default=None, description="Why it waits, or what was lost.")
    finished_at: datetime | None = Field(
        default=None, description="When the claim became Lost or Expired."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")


class SandboxClaim(Resource):
    crd = CrdInfo(
        kind="SandboxClaim",
        plural=CLAIMS,
        scope="Namespaced",
        short_names=("sbclaim",),
        columns=(
            PrinterColumn("Pool", ".spec.poolName"),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Sandbox", ".status.sandboxName"),
            PrinterColumn("Address", ".status.address"),
            AGE_COLUMN,
            PrinterColumn("Node", ".status.nodeName", priority=1),
        ),
        validations={
            "spec": [
                {
                    "rule": "self.poolName == oldSelf.poolName",
                    "message": "spec.poolName is immutable",
                    "reason": "FieldValueForbidden",
                }
            ]
        },
    )

    kind: str = "SandboxClaim"
    spec: SandboxClaimSpec
    status: SandboxClaimStatus | None = None
