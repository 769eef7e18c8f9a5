"""The status a sandbox marked Dead gets (its node lost, deleted or abandoned while
draining), from plain data and ``now``; ``controllers.marking`` writes it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sandlot.api.common import Condition
from sandlot.api.reasons import ConditionType
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import rfc3339
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions


def dead_status(
    reason: str, message: str, now: datetime, current: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The status fields a Dead marking writes: phase, reason, message, and its Ready
    condition merged by type into ``current``'s conditions (Kubernetes condition
    semantics: every other controller's condition is kept, and Ready's
    lastTransitionTime moves only if its status changes)."""
    existing = parse_conditions(((current or {}).get("status") or {}).get("conditions"))
    ready = Condition(type=ConditionType.READY, status="False", reason=reason, message=message)
    return {
        "phase": SandboxPhase.DEAD.value,
        "reason": str(reason),
        "message": message,
        "finishedAt": rfc3339(now),
        "conditions": wire_conditions(set_condition(existing, ready, now)),
    }


__all__ = ["dead_status"]
