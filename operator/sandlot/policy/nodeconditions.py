"""The conditions the node-health controller keeps on a SandboxNode: ``Ready`` for
the observed phase, ``GuardHolding`` while the mass-failure guard holds the
node's marking back, and ``DiskPressure`` mirroring what its agent wrote in
``status.disk``.

Both follow Kubernetes condition semantics (``set_condition``: the transition time
moves only when the status does), so ``GuardHolding``'s lastTransitionTime says when
the hold on this node began; its message is not reworded on every pass, which would
cost a write per pass for nothing a reader needs (the Events say for how long).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sandlot.api.common import Condition
from sandlot.api.node import NodePhase
from sandlot.api.reasons import ConditionType, NodeReason
from sandlot.policy.conditions import find_condition, remove_condition, set_condition

# The node's Ready condition for each observed phase: (status, reason, message).
_READY: dict[NodePhase, tuple[Literal["True", "False"], str, str]] = {
    NodePhase.READY: ("True", NodeReason.LEASE_RENEWED, "The node's agent renews its lease."),
    NodePhase.NOT_READY: ("False", NodeReason.LEASE_EXPIRED, "The node's agent lease has expired."),
    NodePhase.DISABLED: ("False", NodeReason.DRAINED, "The node is drained (spec.unschedulable)."),
}


def hold_conditions(
    current: tuple[Condition, ...], hold: bool, now: datetime
) -> tuple[Condition, ...] | None:
    """The conditions list with the hold condition set or removed; None when unchanged."""
    if hold:
        existing = find_condition(current, ConditionType.GUARD_HOLDING)
        if existing is not None and existing.status == "True":
            return None  # held already: a reworded message is not worth a write
        held = Condition(
            type=ConditionType.GUARD_HOLDING,
            status="True",
            reason=NodeReason.MASS_FAILURE_SUSPECTED,
            message="Most of the fleet is NotReady at once: the operator is likelier "
            "cut off than the nodes dead, so no sandbox is marked Dead until the "
            "fraction drops. If this node is known lost, `sandlot nodes reap NODE` "
            "marks its sandboxes Dead now.",
        )
        updated = set_condition(current, held, now)
    else:
        updated = remove_condition(current, ConditionType.GUARD_HOLDING)
    return None if updated == current else updated


def disk_conditions(
    pressure: bool | None, message: str, current: tuple[Condition, ...], now: datetime
) -> tuple[Condition, ...] | None:
    """The conditions with ``DiskPressure`` mirroring the agent's ``status.disk``
    (``pressure`` None: the agent wrote none, so nothing is said); None when already so."""
    if pressure is None:
        return None
    if pressure:
        status: Literal["True", "False"] = "True"
        reason, text = (
            NodeReason.AGENT_HAS_DISK_PRESSURE,
            message or "The node's disk is under pressure.",
        )
    else:
        status, reason = "False", NodeReason.AGENT_HAS_NO_DISK_PRESSURE
        text = "The node's disk is under its high watermark."
    held = find_condition(current, ConditionType.DISK_PRESSURE)
    if (
        held is not None
        and (held.status, held.reason, held.message) == (status, reason, text)
        and held.last_transition_time is not None
    ):
        return None
    condition = Condition(
        type=ConditionType.DISK_PRESSURE, status=status, reason=reason, message=text
    )
    updated = set_condition(current, condition, now)
    return None if updated == current else updated


def ready_conditions(
    phase: NodePhase, current: tuple[Condition, ...], now: datetime
) -> tuple[Condition, ...] | None:
    """The conditions with ``Ready`` matching ``phase``; None when already so."""
    status, reason, message = _READY[phase]
    held = find_condition(current, ConditionType.READY)
    if (
        held is not None
        and (held.status, held.reason, held.message) == (status, reason, message)
        and held.last_transition_time is not None
    ):
        return None  # what set_condition would keep as it is (every routine pass)
    ready = Condition(type=ConditionType.READY, status=status, reason=reason, message=message)
    updated = set_condition(current, ready, now)
    return None if updated == current else updated


__all__ = [
    "disk_conditions",
    "hold_conditions",
    "ready_conditions",
]
