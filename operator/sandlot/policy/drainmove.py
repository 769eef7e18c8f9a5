"""``sandlot nodes drain --move``: what to do next about each sandbox of the node.

The drain asks each of the node's sandboxes to suspend (``spec.operatingMode:
Suspended``), then cordons the node. Its agent commits and pushes each state (a
drained node suspends what is asked to suspend rather than stopping it); the
scheduler binds each sandbox whose state was pushed to another node; the drain
then gives the sandbox back the mode it had, and the new node's agent pulls the
state and starts it. A sandbox that could not be pushed is ended by the drain as
before (``Stopped``, ``Drained``). ``next_step`` reads one sandbox as it is now
and says what the drain does and whether that sandbox is settled:

=============================================  ===============================
sandbox                                        step
=============================================  ===============================
gone, or in a terminal phase                   done: ended (its reason)
on another node, mode not yet given back       restore its mode
on another node, running again (Restored)      done: moved
on another node, left Suspended (was so)       done: moved, suspended
on the node, suspended, a refused suspend      done: not moved (the refusal)
otherwise                                      wait
=============================================  ===============================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sandlot.api.reasons import ConditionType, SuspendedReason
from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode


class MoveStep(StrEnum):
    WAIT = "wait"
    RESTORE_MODE = "restore-mode"
    DONE = "done"


@dataclass(frozen=True)
class MoveOutcome:
    step: MoveStep
    message: str = ""
    """For DONE: what became of the sandbox, as the drain reports it."""
    moved: bool = False


def _suspended(sb: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in (sb.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.SUSPENDED:
            return c
    return {}


def next_step(sb: Mapping[str, Any] | None, node: str, original: str) -> MoveOutcome:
    """The step for sandbox ``sb`` (None: deleted) drained off ``node``; ``original``:
    its ``operatingMode`` before the drain."""
    if sb is None:
        return MoveOutcome(MoveStep.DONE, "deleted")
    status, spec = sb.get("status") or {}, sb.get("spec") or {}
    if status.get("phase") in TERMINAL_PHASES:
        why = f"{status.get('phase')} ({status.get('reason') or 'no reason'})"
        return MoveOutcome(MoveStep.DONE, f"ended: {why}")
    condition, bound = _suspended(sb), spec.get("nodeName")
    mode = spec.get("operatingMode") or OperatingMode.RUNNING
    if bound != node:
        if mode != original:
            return MoveOutcome(MoveStep.RESTORE_MODE)
        if original == OperatingMode.SUSPENDED:
            return MoveOutcome(MoveStep.DONE, f"moved to {bound}, suspended", moved=True)
        if condition.get("status") == "False" and condition.get("reason") == (
            SuspendedReason.RESTORED
        ):
            return MoveOutcome(MoveStep.DONE, f"moved to {bound}, running", moved=True)
        if condition.get("reason") == SuspendedReason.RESTORE_FAILED:
            return MoveOutcome(MoveStep.DONE, f"moved to {bound}: {condition.get('message')}")
        return MoveOutcome(MoveStep.WAIT)
    if condition.get("reason") == SuspendedReason.SUSPEND_FAILED:
        return MoveOutcome(MoveStep.DONE, f"not moved: {condition.get('message')}")
    return MoveOutcome(MoveStep.WAIT)


def waiting_for(sb: Mapping[str, Any] | None, node: str) -> str:
    """What a sandbox the drain still waits on waits for, for the timeout's report."""
    if sb is None:
        return "nothing"
    status = sb.get("status") or {}
    if (sb.get("spec") or {}).get("nodeName") != node:
        return "its start on the new node"
    if _suspended(sb).get("status") != "True":
        return "its suspension"
    if not status.get("suspendedState"):
        return "its state to be pushed"
    return "a node to move to"


__all__ = ["MoveOutcome", "MoveStep", "next_step", "waiting_for"]
