"""Whether a Running sandbox is Ready, and when to probe it next: pure decisions.

The agent's prober keeps a short history of probe results per sandbox and asks
``decide_readiness`` after each one; it writes the ``Ready`` condition only when
the verdict differs from what the Sandbox records (a transition), never for a
reworded message. As a kubelet's readiness worker does, the verdict flips only
after ``successThreshold`` passes or ``failureThreshold`` failures in a row, and
starts from what is recorded: an agent restarted under a Ready sandbox keeps it
Ready until the probe has failed often enough, instead of flapping it. With
nothing recorded yet the sandbox is not ready, and the first verdict written is
the first threshold reached: a sandbox whose first probe passes costs one write.

The operator's side is ``sandbox_ready``: Running, and either no probe or a
``Ready`` condition that is True.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sandlot.api.common import Condition, key_of
from sandlot.api.probe import Probe
from sandlot.api.reasons import ConditionType, ReadyReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.lifecycle import held_of, probed


@dataclass(frozen=True)
class ProbeResult:
    at: datetime
    """When the probe began."""
    ok: bool
    message: str


@dataclass(frozen=True)
class Verdict:
    ready: bool
    reason: str
    message: str
    write: bool
    """The verdict differs from the recorded condition: write it."""
    next_probe_at: datetime | None
    """When the next probe is due (None: never, the sandbox has no probe)."""

    def condition(self) -> Condition:
        return Condition(
            type=ConditionType.READY,
            status="True" if self.ready else "False",
            reason=self.reason,
            message=self.message,
        )


def _in_a_row(results: Sequence[ProbeResult], ok: bool) -> int:
    count = 0
    for result in reversed(results):
        if result.ok != ok:
            break
        count += 1
    return count


def history_length(probe: Probe) -> int:
    """Results worth keeping: the longest run a threshold asks for."""
    return max(probe.success_threshold, probe.failure_threshold)


def decide_readiness(
    probe: Probe | None,
    started_at: datetime | None,
    recorded: bool | None,
    results: Sequence[ProbeResult],
    now: datetime,
) -> Verdict:
    """The ``Ready`` verdict for a Running, unpaused sandbox.

    ``started_at``: when its process started (None: counted from ``now``);
    ``recorded``: its ``Ready`` condition's status (None: it has none);
    ``results``: this probe's results, oldest first.
    """
    if probe is None:  # ready once Running; a condition left from a removed probe is corrected
        return Verdict(True, ReadyReason.NO_PROBE, "no readiness probe", recorded is False, None)
    first = (started_at or now) + timedelta(seconds=probe.initial_delay_seconds)
    due = max(first, results[-1].at + timedelta(seconds=probe.period_seconds)) if results else first
    passes, failures = _in_a_row(results, True), _in_a_row(results, False)
    if passes >= probe.success_threshold:
        ready, reached = True, True
    elif failures >= probe.failure_threshold:
        ready, reached = False, True
    else:
        ready, reached = bool(recorded), False
    if ready:
        reason, runs, threshold = ReadyReason.PROBE_PASSED, passes, probe.success_threshold
        what = "passed"
    else:
        reason, runs, threshold = ReadyReason.PROBE_FAILED, failures, probe.failure_threshold
        what = "failed"
    detail = results[-1].message if results else "not probed yet"
    message = f"readiness probe {what} {runs} time(s) in a row (threshold {threshold}): {detail}"
    write = reached and ready is not recorded
    return Verdict(ready, reason, message, write, due)


@dataclass(frozen=True)
class ProbeTarget:
    """A sandbox the prober looks after: Running here, not paused."""

    key: str
    uid: str
    container_id: str
    probe: Probe | None
    started_at: datetime | None
    recorded: bool | None


def recorded_ready(status: Mapping[str, Any]) -> bool | None:
    """The status of the ``Ready`` condition in a status body (None: none)."""
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.READY:
            return c.get("status") == "True"
    return None


def probe_of(spec: Mapping[str, Any]) -> Probe | None:
    """The spec's readiness probe (None: none, or a shape the API server would refuse)."""
    raw = spec.get("readinessProbe")
    if not raw:
        return None
    try:
        return Probe.model_validate(raw)
    except ValueError:
        return None


def probe_target(
    obj: Mapping[str, Any], container_id: str, started_at: datetime | None, *, busy: bool
) -> ProbeTarget | None:
    """What to probe of a Sandbox body; None unless its task runs and no step
    holds its work slot (``busy``; ``policy.lifecycle.probed``). A paused one (its
    agent's idle pause included) or a suspended one (an idle suspension included,
    its container gone) keeps its Ready verdict as last written until it runs
    again, so an idle pool member stays claimable and the claim that binds it
    wakes it."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    if not probed(held_of(obj), busy=busy):
        return None
    return ProbeTarget(
        key=key_of(obj),
        uid=str(meta.get("uid") or ""),
        container_id=container_id,
        probe=probe_of(spec),
        started_at=started_at,
        recorded=recorded_ready(status),
    )


def sandbox_ready(phase: str, has_probe: bool, recorded: bool | None) -> bool:
    """Whether a sandbox serves: Running, and no probe or a True ``Ready`` condition."""
    return phase == SandboxPhase.RUNNING and (not has_probe or recorded is True)


def ready_mark(status: Mapping[str, Any], has_probe: bool) -> str | None:
    """What names a sandbox's current Ready episode as its agent wrote it: its
    ``Ready`` condition's ``lastTransitionTime`` with a probe, its ``startedAt``
    without one. The node's clock: compared for equality only, never with a time of
    another machine (a new episode carries another mark)."""
    if has_probe:
        for c in status.get("conditions") or ():
            if isinstance(c, Mapping) and c.get("type") == ConditionType.READY:
                stamp = c.get("lastTransitionTime")
                return str(stamp) if stamp is not None else None
        return None
    started = status.get("startedAt")
    return str(started) if started is not None else None


def observed_ready_since(
    ready: bool,
    mark: str | None,
    previous: tuple[datetime | None, str | None] | None,
    now: datetime,
) -> datetime | None:
    """Since when the operator has seen a sandbox Ready, on its own clock: ``now``
    when it first sees it so (``previous``, its last ``(ready_since, mark)`` seen,
    was not Ready or was another episode), the moment kept while the episode lasts.
    minReadySeconds counts from here, so a node's clock, ahead or behind, moves
    nothing; an operator that starts (or takes over) counts from when it first
    sees each member Ready."""
    if not ready:
        return None
    if previous is not None and previous[0] is not None and previous[1] == mark:
        return previous[0]
    return now


__all__ = [
    "ProbeResult",
    "ProbeTarget",
    "Verdict",
    "decide_readiness",
    "history_length",
    "observed_ready_since",
    "probe_of",
    "probe_target",
    "ready_mark",
    "recorded_ready",
    "sandbox_ready",
]
