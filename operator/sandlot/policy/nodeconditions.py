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
from sandlot.policy.conditions import find_condition, remove_condition, set_condition

# Condition set on a NotReady node whose handling the mass-failure guard holds back.
HOLD_CONDITION_TYPE = "GuardHolding"
HOLD_CONDITION_REASON = "MassFailureSuspected"

# The node's Ready condition for each observed phase: (status, reason, message).
_READY: dict[NodePhase, tuple[Literal["True", "False"], str, str]] = {
    NodePhase.READY: ("True", "LeaseRenewed", "The node's agent renews its lease."),
    NodePhase.NOT_READY: ("False", "LeaseExpired", "The node's agent lease has expired."),
    NodePhase.DISABLED: ("False", "Drained", "The node is drained (spec.unschedulable)."),
}


def hold_conditions(
    current: tuple[Condition, ...], hold: bool, now: datetime
) -> tuple[Condition, ...] | None:
    """The conditions list with the hold condition set or removed; None when unchanged."""
    if hold:
        existing = find_condition(current, HOLD_CONDITION_TYPE)
        if existing is not None and existing.status == "True":
            return None  # held already: a reworded message is not worth a write
        held = Condition(
            type=HOLD_CONDITION_TYPE,
            status="True",
            reason=HOLD_CONDITION_REASON,
            message="Most of the fleet is NotReady at once: the operator is likelier "
            "cut off than the nodes dead, so no sandbox is marked Dead until the "
            "fraction drops. If this node is known lost, `sandlot nodes reap NODE` "
            "marks its sandboxes Dead now.",
        )
        updated = set_condition(current, held, now)
    else:
        updated = remove_condition(current, HOLD_CONDITION_TYPE)
    return None if updated == current else updated


DISK_CONDITION_TYPE = "DiskPressure"
DISK_PRESSURE_REASON = "AgentHasDiskPressure"
NO_DISK_PRESSURE_REASON = "AgentHasNoDiskPressure"


def disk_conditions(
    pressure: bool | None, message: str, current: tuple[Condition, ...], now: datetime
) -> tuple[Condition, ...] | None:
    """The conditions with ``DiskPressure`` mirroring the agent's ``status.disk``
    (``pressure`` None: the agent wrote none, so nothing is said); None when already so."""
    if pressure is None:
        return None
    if pressure:
        status: Literal["True", "False"] = "True"
        reason, text = DISK_PRESSURE_REASON, message or "The node's disk is under pressure."
    else:
        status, reason = "False", NO_DISK_PRESSURE_REASON
        text = "The node's disk is under its high watermark."
    held = find_condition(current, DISK_CONDITION_TYPE)
    if (
        held is not None
        and (held.status, held.reason, held.message) == (status, reason, text)
        and held.last_transition_time is not None
    ):
        return None
    condition = Condition(type=DISK_CONDITION_TYPE, status=status, reason=reason, message=text)
    updated = set_condition(current, condition, now)
    return None if updated == current else updated


def ready_conditions(
    phase: NodePhase, current: tuple[Condition, ...], now: datetime
) -> tuple[Condition, ...] | None:
    """The conditions with ``Ready`` matching ``phase``; None when already so."""
    status, reason, message = _READY[phase]
    held = find_condition(current, "Ready")
    if (
        held is not None
        and (held.status, held.reason, held.message) == (status, reason, message)
        and held.last_transition_time is not None
    ):
        return None  # what set_condition would keep as it is (every routine pass)
    ready = Condition(type="Ready", status=status, reason=reason, message=message)
    updated = set_condition(current, ready, now)
    return None if updated == current else updated


__all__ = [
    "DISK_CONDITION_TYPE",
    "DISK_PRESSURE_REASON",
    "HOLD_CONDITION_REASON",
    "HOLD_CONDITION_TYPE",
    "NO_DISK_PRESSURE_REASON",
    "disk_conditions",
    "hold_conditions",
    "ready_conditions",
]
