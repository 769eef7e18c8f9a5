"""What the node-health passes read of a SandboxNode's body, parsed once per version.

A pass runs far more often than a node's body changes (every resync and every lease
deadline, for every node), and reading the body through the watch's mapping views
and validating its conditions on every pass was most of a quiet pass's CPU. The
controller keeps one ``NodeRead`` per node, made when an event or its own write
brings a new body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandlot.api.common import Condition
from sandlot.api.node import NodeHealthTracking, ReapRequest
from sandlot.policy.conditions import parse_conditions
from sandlot.policy.nodeconditions import disk_conditions
from sandlot.policy.nodehealth import NodeView


def node_tracking(body: Mapping[str, Any]) -> NodeHealthTracking:
    return NodeHealthTracking.model_validate((body.get("status") or {}).get("health") or {})


def _unschedulable(body: Mapping[str, Any]) -> bool:
    return bool((body.get("spec") or {}).get("unschedulable", False))


def _reap_requested(body: Mapping[str, Any]) -> bool:
    """``spec.reap`` names the episode in the stored status: both moments as the
    operator wrote them (the request copies it), so a plain equality, on no clock."""
    request = (body.get("spec") or {}).get("reap")
    if not request:
        return False
    since = node_tracking(body).unhealthy_since
    return since is not None and ReapRequest.model_validate(request).unhealthy_since == since


def _disk_pressure(status: Mapping[str, Any]) -> bool | None:
    disk = status.get("disk")
    if not isinstance(disk, Mapping) or "pressure" not in disk:
        return None
    return bool(disk["pressure"])


@dataclass(frozen=True)
class NodeRead:
    """A SandboxNode's body as the node-health decision reads it."""

    name: str
    unschedulable: bool
    phase: str | None
    conditions: tuple[Condition, ...]
    reap_requested: bool = False
    disk_pressure: bool | None = None
    """``status.disk.pressure`` as its agent wrote it (None: not written)."""
    disk_message: str = ""

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> NodeRead:
        status = body.get("status") or {}
        return cls(
            name=body["metadata"]["name"],
            unschedulable=_unschedulable(body),
            phase=status.get("phase"),
            conditions=parse_conditions(status.get("conditions")),
            reap_requested=_reap_requested(body),
            disk_pressure=_disk_pressure(status),
            disk_message=str((status.get("disk") or {}).get("message") or ""),
        )

    def with_disk(self, patch: dict[str, Any] | None, stamp: datetime) -> dict[str, Any] | None:
        """``patch`` with the ``DiskPressure`` condition mirroring ``status.disk`` (over the
        patch's conditions when it has some); ``patch`` itself when already so."""
        base = self.conditions
        if patch is not None and "conditions" in patch:
            base = parse_conditions(patch["conditions"])
        updated = disk_conditions(self.disk_pressure, self.disk_message, base, stamp)
        if updated is None:
            return patch
        patch = dict(patch or {})
        patch["conditions"] = [c.wire() for c in updated]
        return patch

    def view(self, first_seen: datetime) -> NodeView:
        return NodeView(
            name=self.name,
            unschedulable=self.unschedulable,
            first_seen=first_seen,
            phase=self.phase,
            conditions=self.conditions,
            reap_requested=self.reap_requested,
        )


__all__ = ["NodeRead", "node_tracking"]
