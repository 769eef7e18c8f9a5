"""The statuses that end a sandbox, from plain data and ``now``: ended by the agent,
stopped by its lifetime or its claim's, and marked Dead (its node lost, deleted or
abandoned while draining), which ``controllers.marking`` writes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sandlot.api.common import Condition
from sandlot.api.reasons import ConditionType
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import rfc3339
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions


def ended_status(
    phase: SandboxPhase, reason: str, message: str, now: datetime, exit_code: int | None = None
) -> dict[str, Any]:
    """A terminal status: phase, reason, message, ``finishedAt``, the exit code if known."""
    status: dict[str, Any] = {
        "phase": phase.value,
        "reason": str(reason),  # plain, as read back, also for a SandboxReason
        "message": message,
        "finishedAt": rfc3339(now),
    }
    if exit_code is not None:
        status["exitCode"] = exit_code
    return status


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
        **ended_status(SandboxPhase.DEAD, reason, message, now),
        "conditions": wire_conditions(set_condition(existing, ready, now)),
    }


__all__ = ["dead_status", "ended_status"]
