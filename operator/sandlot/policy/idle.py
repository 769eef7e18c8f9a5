"""Idle auto-pause (``spec.idleTimeoutSeconds``): pure decisions.

The node's agent samples each eligible sandbox (its open exec, files and
port-forward sessions, its cgroup's CPU time) and ``observe`` says when it has
been quiet for its timeout: no session open and less CPU than the threshold
between every two samples. A sample it cannot read (no CPU figure) counts as
use: a blind agent never freezes a sandbox.

The agent pauses on its own and records it in the ``Paused`` condition with
reason ``Idle`` while the spec keeps asking for Running: an agent may write only
its sandboxes' status, and a spec the user owns is not rewritten under them.
``policy.operatingmode`` therefore treats an idle pause as settled for a
Running spec (the sync does not thaw it), and the stream server resumes it
before serving the next exec, files call or port-forward (``wake_condition``).
A claim binding an idle-paused pool member resumes it too (``claim_wakes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sandlot.api.common import Condition
from sandlot.api.keys import CLAIM_LABEL, CLAIMED_IDLE_ANNOTATION, POOL_LABEL
from sandlot.api.reasons import ConditionType, PausedReason, SuspendedReason
from sandlot.api.sandbox import IdleAction, OperatingMode, SandboxPhase
from sandlot.policy.operatingmode import idle_paused, recorded_paused, wanted_mode
from sandlot.policy.suspension import held_mode, idle_suspended, recorded_suspended


@dataclass(frozen=True)
class IdleSample:
    """One look at a sandbox."""

    at: datetime
    sessions: int
    """Exec, files and port-forward sessions open into it."""
    cpu_ns: int | None
    """Nanoseconds of CPU its cgroup used so far; None when unreadable."""


@dataclass(frozen=True)
class IdleTrack:
    """What the agent remembers of a sandbox between samples."""

    quiet_since: datetime
    """Since when it has been neither in use nor busy."""
    last: IdleSample


class IdleStep(StrEnum):
    WATCH = "watch"
    PAUSE = "pause"


def idle_timeout(obj: Mapping[str, Any]) -> timedelta | None:
    """The sandbox's idle timeout while it may be idle-paused, else None: it is
    Running, its spec asks for Running and it is neither paused nor suspended."""
    seconds = (obj.get("spec") or {}).get("idleTimeoutSeconds")
    if not seconds:
        return None
    if (obj.get("status") or {}).get("phase") != SandboxPhase.RUNNING:
        return None
    if wanted_mode(obj) is not OperatingMode.RUNNING or recorded_paused(obj):
        return None
    if recorded_suspended(obj):
        return None
    return timedelta(seconds=int(seconds))


def idle_action(obj: Mapping[str, Any]) -> IdleAction:
    """``spec.idleAction``: Pause unless it says Suspend."""
    raw = (obj.get("spec") or {}).get("idleAction")
    return IdleAction.SUSPEND if raw == IdleAction.SUSPEND else IdleAction.PAUSE


def effective_mode(obj: Mapping[str, Any], waking: bool = False) -> OperatingMode:
    """``policy.suspension.held_mode`` of a Sandbox body."""
    return held_mode(wanted_mode(obj), idle_suspended(obj), waking)


def restores_for_stream(obj: Mapping[str, Any]) -> bool:
    """Whether a stream into this sandbox starts it again first: its agent
    suspended it for being idle and its spec still asks for Running."""
    return wanted_mode(obj) is OperatingMode.RUNNING and idle_suspended(obj)


def woken_outcome(obj: Mapping[str, Any] | None, uid: str) -> str | None:
    """What became of an idle-suspended sandbox a use asked to run again, as its
    agent's view shows it: ``"running"``, why it will not be served (gone, ended,
    a refused restore, no room), or None while the restore is still on its way."""
    if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
        return "it was deleted"
    status = obj.get("status") or {}
    if status.get("phase") != SandboxPhase.RUNNING:
        return f"it is {status.get('phase')} ({status.get('reason')})"
    if idle_suspended(obj):
        return None
    if recorded_suspended(obj):  # waiting for room, a failed restore, or suspended on purpose
        condition = next(
            c for c in status.get("conditions") or () if c.get("type") == ConditionType.SUSPENDED
        )
        return str(condition.get("message") or condition.get("reason"))
    return "running" if status.get("containerId") else None


def unclaimed_member(obj: Mapping[str, Any]) -> bool:
    """A pool's member no claim has taken yet (a bind moves it from the pool's
    label to the claim's)."""
    return POOL_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


IDLE_REASONS = frozenset(
    {PausedReason.IDLE, SuspendedReason.IDLE, SuspendedReason.IDLE_PUSH_PENDING}
)


def idle_mark(obj: Mapping[str, Any]) -> str | None:
    """What names the sandbox's current idle pause or suspension (None: it is not
    idle): its condition's type and ``lastTransitionTime`` as its agent wrote them.
    A later idle episode carries another time; marks are compared for equality
    only, never ordered against another clock's time."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if not isinstance(c, Mapping) or c.get("status") != "True":
            continue
        if c.get("reason") in IDLE_REASONS and c.get("type") in (
            ConditionType.PAUSED,
            ConditionType.SUSPENDED,
        ):
            return f"{c.get('type')} {c.get('lastTransitionTime') or ''}".strip()
    return None


def idle_before_claim(obj: Mapping[str, Any]) -> bool:
    """Whether its idle pause or suspension began before the claim that took it: the
    claim found it in this very one (``sandlot.dev/claimed-idle``, written by the
    bind from the status it was guarded by, equals ``idle_mark``). The claim's time
    (operator's clock) is never compared with the condition's (the node's)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    found = annotations.get(CLAIMED_IDLE_ANNOTATION)
    return isinstance(found, str) and found != "" and found == idle_mark(obj)


def claim_wakes(obj: Mapping[str, Any], paused_unclaimed: bool) -> bool:
    """Whether a claim binding an idle-paused (or idle-suspended) member resumes it
    now: it went idle as an unclaimed member and a claim holds it since. The agent
    remembers which it paused unclaimed (``paused_unclaimed``); a restarted agent
    reads it from the claim's mark of the idle it found (``idle_before_claim``). One
    idle after its claim waits for use."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    idle = idle_paused(obj) or restores_for_stream(obj)
    before = paused_unclaimed or idle_before_claim(obj)
    return before and idle and CLAIM_LABEL in labels


def thaws_for_stream(obj: Mapping[str, Any], paused_resume: bool) -> bool:
    """Whether an exec, files call or port-forward thaws this sandbox before it is
    served: its agent paused it for being idle, or (``paused_resume``, the agent's
    ``paused_streams: Resume``) its spec asks for Paused and it is not suspended.
    Otherwise a pause is refused naming spec.operatingMode (``stream_refusal``)."""
    mode = wanted_mode(obj)
    if mode is OperatingMode.RUNNING:
        return idle_paused(obj)
    return paused_resume and mode is OperatingMode.PAUSED and not recorded_suspended(obj)


def _busy(last: IdleSample, sample: IdleSample, threshold_cores: float) -> bool:
    if sample.sessions > 0 or sample.cpu_ns is None or last.cpu_ns is None:
        return True
    seconds = (sample.at - last.at).total_seconds()
    if seconds <= 0:
        return False  # no time between them: nothing to judge, nothing changes
    used = max(0, sample.cpu_ns - last.cpu_ns) / 1e9
    return used / seconds > threshold_cores


def observe(
    track: IdleTrack | None,
    sample: IdleSample,
    *,
    timeout: timedelta,
    threshold_cores: float,
) -> tuple[IdleTrack, IdleStep]:
    """The track after ``sample`` and whether to pause now. A first sample starts
    the quiet clock (nothing is known of the time before it); a session or CPU
    above ``threshold_cores`` (a fraction of one core, averaged since the last
    sample) restarts it."""
    if track is None:
        return IdleTrack(quiet_since=sample.at, last=sample), IdleStep.WATCH
    quiet_since = sample.at if _busy(track.last, sample, threshold_cores) else track.quiet_since
    step = IdleStep.PAUSE if sample.at - quiet_since >= timeout else IdleStep.WATCH
    return IdleTrack(quiet_since=quiet_since, last=sample), step


def idle_condition(node: str, timeout: timedelta, generation: int | None) -> Condition:
    return Condition(
        type=ConditionType.PAUSED,
        status="True",
        reason=PausedReason.IDLE,
        message=f"processes frozen on node {node} after {timeout.total_seconds():g}s without "
        "use (spec.idleTimeoutSeconds); the next exec, files call or port-forward resumes it",
        observed_generation=generation,
    )


def idle_suspend_condition(
    node: str, timeout: timedelta, generation: int | None, pushed: str | None = None
) -> Condition:
    """The ``Suspended`` condition of a sandbox its agent suspended for being idle."""
    return Condition(
        type=ConditionType.SUSPENDED,
        status="True",
        reason=SuspendedReason.IDLE,
        message=f"filesystem committed and container removed on node {node} after "
        f"{timeout.total_seconds():g}s without use (spec.idleTimeoutSeconds, idleAction "
        "Suspend)"
        + (f", {pushed}" if pushed else "")
        + "; the next exec, files call, port-forward or claim starts it again",
        observed_generation=generation,
    )


def wake_condition(
    node: str, kind: str, generation: int | None, spec_paused: bool = False
) -> Condition:
    """The ``Paused`` condition once a ``kind`` stream thawed it: after an idle pause,
    or (``spec_paused``) while the spec asks for Paused and the agent is set to
    thaw such sandboxes for use: the sync freezes it again once its streams end."""
    if spec_paused:
        return Condition(
            type=ConditionType.PAUSED,
            status="False",
            reason=PausedReason.RESUMED_FOR_USE,
            message=f"processes running on node {node} for {kind} while spec.operatingMode "
            "is Paused (the agent's paused_streams is Resume); frozen again when its "
            "streams end",
            observed_generation=generation,
        )
    return Condition(
        type=ConditionType.PAUSED,
        status="False",
        reason=PausedReason.RESUMED,
        message=f"processes running again on node {node}: resumed for {kind} after an idle pause",
        observed_generation=generation,
    )


__all__ = [
    "IdleSample",
    "IdleStep",
    "IdleTrack",
    "claim_wakes",
    "effective_mode",
    "idle_action",
    "idle_before_claim",
    "idle_condition",
    "idle_mark",
    "idle_paused",
    "idle_suspend_condition",
    "idle_timeout",
    "observe",
    "restores_for_stream",
    "thaws_for_stream",
    "unclaimed_member",
    "wake_condition",
    "woken_outcome",
]
