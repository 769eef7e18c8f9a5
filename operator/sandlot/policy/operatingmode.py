"""Pausing and resuming a sandbox (``spec.operatingMode``): pure decisions.

The sync pass compares the mode a Sandbox asks for with what its ``Paused``
condition records, and only a difference becomes work (``mode_pending``): the
sync never asks containerd about every task on every pass. The work item makes
the call the mode asks for at once (``mode_call``); only when the runtime refuses
it does it read the task, and ``decide_mode`` says what stands (recorded as
asked already, left, or a true refusal); the condition it then
writes (``paused_condition``) is what the next pass compares against.

A pause or resume the runtime refused (not a timeout: that is tried again on the
next pass) is recorded with the spec's generation and is not tried again until
the spec changes, so a runtime that cannot freeze is not asked on every pass.
Streams are refused while the spec asks for Paused or the task is still frozen
(``stream_refusal``): an exec into a frozen task would hang until its deadline.
They are refused as well while it asks for Suspended or the filesystem is not
restored yet (``policy.suspension``): there is no container to run them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sandlot.api.common import Condition, key_of
from sandlot.api.reasons import ConditionType, PausedReason
from sandlot.api.sandbox import OperatingMode
from sandlot.policy.suspension import recorded_suspended, suspension_outcome

FAILURE_REASONS = frozenset({PausedReason.PAUSE_FAILED, PausedReason.RESUME_FAILED})


class TaskState(StrEnum):
    """A container task's state as the runtime reports it (``adapters.runtime``
    re-exports it; here so decisions can take it)."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
    PAUSED = "paused"
    PAUSING = "pausing"
    UNKNOWN = "unknown"


FROZEN = frozenset({TaskState.PAUSED, TaskState.PAUSING})


class ModeStep(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    RECORD = "record"
    """The task is as the spec asks already: only the condition is written."""
    WAIT = "wait"
    """The freezer is still freezing: look again on the next pass."""
    LEAVE = "leave"
    """No live task (stopped, never started, unknown): the reaper's and the sync's."""


def wanted_mode(obj: Mapping[str, Any]) -> OperatingMode:
    """The mode a Sandbox body asks for (Running when unset, as the CRD defaults it)."""
    raw = (obj.get("spec") or {}).get("operatingMode") or OperatingMode.RUNNING
    try:
        return OperatingMode(raw)
    except ValueError:
        return OperatingMode.RUNNING


def _paused_condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.PAUSED:
            return c
    return None


def recorded_paused(obj: Mapping[str, Any]) -> bool:
    """The ``Paused`` condition is True: the agent froze the task (absent: never paused)."""
    condition = _paused_condition(obj)
    return condition is not None and condition.get("status") == "True"


def idle_paused(obj: Mapping[str, Any]) -> bool:
    """Its agent froze it for being idle (``policy.idle``): the ``Paused`` condition
    True with reason ``Idle`` while the spec asks for Running."""
    condition = _paused_condition(obj)
    return (
        condition is not None
        and condition.get("status") == "True"
        and condition.get("reason") == PausedReason.IDLE
    )


def failed_at_generation(obj: Mapping[str, Any]) -> bool:
    """The last pause or resume was refused by the runtime for this very spec."""
    condition = _paused_condition(obj)
    if condition is None or condition.get("reason") not in FAILURE_REASONS:
        return False
    generation = (obj.get("metadata") or {}).get("generation")
    return generation is not None and condition.get("observedGeneration") == generation


def mode_pending(mode: OperatingMode, paused: bool, failed: bool, idle: bool = False) -> bool:
    """Whether a Running sandbox needs its mode applied: the spec asks for another
    state than the condition records, and this spec has not failed already. An
    idle pause (``idle``) is settled for a Running spec: use resumes it, not the sync."""
    if idle:  # a spec asking for Paused takes the frozen task over (RECORD)
        return mode is OperatingMode.PAUSED and not failed
    return not failed and (mode is OperatingMode.PAUSED) != paused


def mode_outcome(obj: Mapping[str, Any], mode: OperatingMode) -> str | None:
    """Whether the sandbox's agent has applied ``mode``, as a waiter sees it: None
    not yet; ``"applied"`` the ``Paused`` condition records it (a sandbox never
    paused is running already; one idle-paused counts as Running, its next use
    thaws it); else the message of the runtime's refusal for this
    very spec."""
    if mode is OperatingMode.SUSPENDED or recorded_suspended(obj):
        return suspension_outcome(obj, mode)
    condition = _paused_condition(obj)
    if failed_at_generation(obj) and condition is not None:
        return str(condition.get("message") or condition.get("reason"))
    if mode is OperatingMode.RUNNING and idle_paused(obj):
        return "applied"  # Running as asked: its next exec, files call or port-forward thaws it
    return "applied" if recorded_paused(obj) == (mode is OperatingMode.PAUSED) else None


def mode_call(mode: OperatingMode) -> ModeStep:
    """The call a pending ``mode`` makes first, before any read of the task: the
    condition records the other state, so the task is all but always in it. The
    runtime refuses a call that does not fit the task (paused already, not live), and
    only then is the task read and ``decide_mode`` asked what stands."""
    return ModeStep.PAUSE if mode is OperatingMode.PAUSED else ModeStep.RESUME


def mode_settled(step: ModeStep | None, recorded: bool) -> bool:
    """Whether applying a mode left nothing for a pass: the task was paused, resumed
    or found as asked (a refusal included: it is not tried again for this spec) and
    the condition ``recorded`` it. Waiting, leaving, no answer or an unwritten
    record leave the next pass to look again."""
    return recorded and step in (ModeStep.PAUSE, ModeStep.RESUME, ModeStep.RECORD)


def decide_mode(mode: OperatingMode, task: TaskState | None) -> ModeStep:
    """What to do with a task in state ``task`` (None: no task) for ``mode``."""
    if task is None or task not in (TaskState.RUNNING, *FROZEN):
        return ModeStep.LEAVE
    if mode is OperatingMode.PAUSED:
        if task is TaskState.PAUSING:
            return ModeStep.WAIT
        return ModeStep.RECORD if task is TaskState.PAUSED else ModeStep.PAUSE
    return ModeStep.RESUME if task in FROZEN else ModeStep.RECORD


def paused_condition(
    mode: OperatingMode, node: str, generation: int | None, error: str | None = None
) -> Condition:
    """The condition after applying ``mode`` on ``node``; ``error``: the runtime refused
    (then the task is as it was: frozen after a failed resume, running after a
    failed pause)."""
    pausing = mode is OperatingMode.PAUSED
    if error is not None:
        return Condition(
            type=ConditionType.PAUSED,
            status="False" if pausing else "True",
            reason=PausedReason.PAUSE_FAILED if pausing else PausedReason.RESUME_FAILED,
            message=f"{'pause' if pausing else 'resume'} failed on node {node}: {error}; "
            "not tried again until the spec changes",
            observed_generation=generation,
        )
    return Condition(
        type=ConditionType.PAUSED,
        status="True" if pausing else "False",
        reason=PausedReason.PAUSED if pausing else PausedReason.RESUMED,
        message=f"processes frozen on node {node}, memory kept"
        if pausing
        else f"processes running again on node {node}",
        observed_generation=generation,
    )


def stream_refusal(obj: Mapping[str, Any], kind: str) -> str | None:
    """Why a ``kind`` stream (exec, files, port-forward) into this Sandbox is refused
    because of its mode, or None. Its log stays readable."""
    key = key_of(obj)
    if wanted_mode(obj) is OperatingMode.SUSPENDED:
        return (
            f"sandbox {key} is Suspended (spec.operatingMode): its container is removed and "
            f"{kind} needs it running; set spec.operatingMode to Running first"
        )
    if recorded_suspended(obj):
        return f"sandbox {key} is still suspended (restoring): try {kind} again in a moment"
    if wanted_mode(obj) is OperatingMode.PAUSED:
        return (
            f"sandbox {key} is Paused (spec.operatingMode): {kind} needs it running; "
            "set spec.operatingMode to Running first"
        )
    if recorded_paused(obj):
        return f"sandbox {key} is still frozen (resuming): try {kind} again in a moment"
    return None


__all__ = [
    "FROZEN",
    "ModeStep",
    "TaskState",
    "decide_mode",
    "failed_at_generation",
    "idle_paused",
    "mode_call",
    "mode_pending",
    "mode_settled",
    "paused_condition",
    "recorded_paused",
    "stream_refusal",
    "wanted_mode",
]
