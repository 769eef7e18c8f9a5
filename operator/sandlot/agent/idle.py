"""Idle auto-pause and resume on use, applied (``policy.idle`` decides).

A loop samples every sandbox with ``spec.idleTimeoutSeconds`` (its stream
sessions as the stream server counts them, its cgroup's CPU time) and freezes
the ones quiet for that long, saying so in the ``Paused`` condition (reason
``Idle``) and an Event. The stream server calls ``wake`` before it serves an
exec, files call or port-forward into an idle-paused sandbox: one bounded
containerd call thaws it, then the condition and an Event say so. Pausing and
waking hold one lock, so a stream admitted meanwhile is never frozen under it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sandlot.adapters.nodeguard import cgroup_v2
from sandlot.adapters.objects import Objects, post_event
from sandlot.adapters.runtime import Runtime, RuntimeError_, TaskState
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.status import StatusWriter
from sandlot.agent.uses import SandboxUses
from sandlot.agent.workpools import SandboxPools
from sandlot.api.common import GROUP, VERSION, Condition, key_of
from sandlot.api.reasons import EventReason
from sandlot.api.sandbox import IdleAction, OperatingMode, SandboxPhase
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions
from sandlot.policy.idle import (
    IdleSample,
    IdleStep,
    IdleTrack,
    claim_wakes,
    idle_action,
    idle_condition,
    idle_timeout,
    observe,
    restores_for_stream,
    unclaimed_member,
    wake_condition,
)
from sandlot.policy.ocispec import cgroups_path_for
from sandlot.policy.operatingmode import FROZEN, idle_paused, wanted_mode

log = logging.getLogger(__name__)

RUNNING_ONLY = frozenset({SandboxPhase.RUNNING})
EventPoster = Callable[[Mapping[str, Any], str, str, str], None]


def cpu_used_ns(cgroup_root: str, cgroup_parent: str, container_id: str) -> int | None:
    """Nanoseconds of CPU the container's cgroup used so far; None when unreadable."""
    relative = cgroups_path_for(container_id, cgroup_parent).lstrip("/")
    try:
        if cgroup_v2(cgroup_root):
            fields = (Path(cgroup_root) / relative / "cpu.stat").read_text().split()
            return int(fields[fields.index("usage_usec") + 1]) * 1000
        return int((Path(cgroup_root) / "cpuacct" / relative / "cpuacct.usage").read_text())
    except (OSError, ValueError, IndexError):
        return None


class IdlePauses:
    """Pauses this node's idle sandboxes and wakes them on use. ``uses`` is where it
    meets the stream server and the sync: the streams open into a sandbox hold off
    its pause, and a freeze and a thaw for use take one lock."""

    def __init__(
        self,
        rt: Runtime,
        node: str,
        status: StatusWriter,
        sandboxes: Callable[[], Iterable[Mapping[str, Any]]],
        metrics: AgentMetrics,
        post_event: EventPoster,
        *,
        clock: Callable[[], datetime],
        threshold_cores: float,
        cgroup_root: str,
        cgroup_parent: str,
        call_timeout: float,
        slots: SandboxPools,
        sandbox_of: Callable[[str], Mapping[str, Any] | None] = lambda _key: None,
        uses: SandboxUses | None = None,
    ) -> None:
        self.node = node
        self.slots = slots  # each sandbox's one work slot: a freeze holds it (policy.lifecycle)
        self.status = status
        self.sandboxes = sandboxes
        self.metrics = metrics
        self.post_event = post_event
        self.clock = clock
        self.threshold_cores = threshold_cores
        self.cgroup_root = cgroup_root
        self.cgroup_parent = cgroup_parent
        self.call_timeout = call_timeout
        self.rt = rt
        uses = uses if uses is not None else SandboxUses(sandbox_of)
        self.sessions = uses.sessions
        self._tracks: dict[str, IdleTrack] = {}
        # Idle-paused while unclaimed pool members: a claim binding one resumes it.
        # Memory only: after a restart, one seen with its pool's label again counts.
        self._unclaimed: set[str] = set()
        self._lock = uses.thaws
        self.suspends = uses.suspends  # idleAction Suspend: due, and woken

    def pass_once(self) -> None:
        """Sample each sandbox with an idle timeout; pause those quiet for it."""
        seen: set[str] = set()
        present: set[str] = set()
        suspended: set[str] = set()
        for sb in self.sandboxes():
            present.add(key_of(sb))
            if restores_for_stream(sb):
                suspended.add(key_of(sb))
            if idle_paused(sb) or restores_for_stream(sb):
                self._claimed(sb)
                continue
            timeout = idle_timeout(sb)
            container = (sb.get("status") or {}).get("containerId")
            if timeout is None or not container:
                continue
            key = key_of(sb)
            seen.add(key)
            with self._lock:
                sample = IdleSample(
                    at=self.clock(),
                    sessions=self.sessions(key),
                    cpu_ns=cpu_used_ns(self.cgroup_root, self.cgroup_parent, container),
                )
                track, step = observe(
                    self._tracks.get(key),
                    sample,
                    timeout=timeout,
                    threshold_cores=self.threshold_cores,
                )
                self._tracks[key] = track
                suspend = step is IdleStep.PAUSE and idle_action(sb) is IdleAction.SUSPEND
                if suspend and self.suspends.request(key):
                    self._tracks.pop(key, None)
                    continue  # the sync suspends it (``suspend_idle``), or a use cancels
            if step is IdleStep.PAUSE:
                self._freeze(sb, key, container, timeout)
        with self._lock:
            for gone in set(self._tracks) - seen:
                del self._tracks[gone]
            self._unclaimed &= present
        self.suspends.forget(present, suspended)
        self.metrics.idle_passes.inc()

    def _claimed(self, sb: Mapping[str, Any]) -> None:
        """Resume an idle-paused member a claim has bound since its pause."""
        key = key_of(sb)
        if unclaimed_member(sb):
            self._unclaimed.add(key)
        elif claim_wakes(sb, key in self._unclaimed):
            self._unclaimed.discard(key)
            if restores_for_stream(sb):
                self.suspends.wake_for_claim(sb)
            else:
                self.wake(sb, "claim")

    def _freeze(self, sb: Mapping[str, Any], key: str, container: str, timeout: timedelta) -> None:
        """Freeze an idle sandbox and record it, holding its work slot throughout
        (``policy.lifecycle``: no freeze lands in a stop, commit or snapshot under
        way, and a freeze whose record fails is found frozen and unrecorded by the
        next sync pass, which thaws it)."""
        with self.slots.holding(key) as held:
            if not held:
                log.info("sandbox %s: idle, but another step holds it: not paused now", key)
                return
            with self._lock:  # a stream admitted since the sample keeps it running
                paused = self.sessions(key) == 0 and self._pause(key, container)
            if not paused:
                return
            if unclaimed_member(sb):
                self._unclaimed.add(key)
            self._say(sb, idle_condition(self.node, timeout, _generation(sb)))
        self.metrics.idle_pauses.inc()
        self._event(
            sb, EventReason.IDLE_PAUSED, f"paused after {timeout.total_seconds():g}s without use"
        )

    def _pause(self, key: str, container: str) -> bool:
        """Freeze ``container`` if it is running; its quiet clock starts again."""
        try:
            task = self.rt.get_task(container, timeout=self.call_timeout)
            if task is None or task.state is not TaskState.RUNNING:
                return False
            self.rt.pause_task(container, timeout=self.call_timeout)
        except RuntimeError_ as exc:  # a timeout too: the next quiet sample tries again
            log.warning("sandbox %s: idle pause failed: %s", key, exc)
            return False
        self._tracks.pop(key, None)
        log.info("sandbox %s: paused for being idle", key)
        return True

    def wake(self, sb: Mapping[str, Any], kind: str) -> str | None:
        """Thaw a paused sandbox before a ``kind`` stream is served (idle-paused, or
        paused by its spec when the agent resumes those for use); None when it
        runs, else why not (the stream is refused with it)."""
        key = key_of(sb)
        container = (sb.get("status") or {}).get("containerId")
        rt = self.rt
        if not container:
            return (
                f"sandbox {key} is paused for being idle and node {self.node} cannot resume it yet"
            )
        with self._lock:
            try:
                task = rt.get_task(container, timeout=self.call_timeout)
                thawed = task is not None and task.state in FROZEN
                if thawed:
                    rt.resume_task(container, timeout=self.call_timeout)
            except RuntimeError_ as exc:
                log.warning("sandbox %s: resume for %s failed: %s", key, kind, exc)
                return f"sandbox {key} is paused and did not resume for {kind}: {exc}"
            self._tracks.pop(key, None)  # its quiet clock starts on the next sample
        spec_paused = wanted_mode(sb) is OperatingMode.PAUSED
        self._say(sb, wake_condition(self.node, kind, _generation(sb), spec_paused))
        if thawed:
            log.info("sandbox %s: resumed for %s", key, kind)
            self.metrics.idle_resumes.inc()
            why = "while spec.operatingMode is Paused" if spec_paused else "after an idle pause"
            self._event(sb, EventReason.RESUMED_ON_USE, f"resumed for {kind} {why}")
        return None

    # -- what suspending for idleness asks (``agent.suspend.IdleHooks``)

    def begin(self, key: str) -> bool:
        return self.suspends.begin(key)

    def refused(self, key: str) -> None:
        log.warning("sandbox %s: its filesystem cannot be committed: paused when idle", key)
        self.suspends.refused(key)

    def waking(self, key: str) -> bool:
        return self.suspends.waking(key)

    def suspended(self, sb: Mapping[str, Any]) -> None:
        key = key_of(sb)
        if unclaimed_member(sb):
            self._unclaimed.add(key)
        self.metrics.idle_suspends.inc()
        seconds = (sb.get("spec") or {}).get("idleTimeoutSeconds")
        self._event(sb, EventReason.IDLE_SUSPENDED, f"suspended after {seconds}s without use")

    def _say(self, sb: Mapping[str, Any], condition: Condition) -> None:
        def merged(current: Mapping[str, Any]) -> dict[str, Any]:
            existing = parse_conditions((current.get("status") or {}).get("conditions"))
            return {"conditions": wire_conditions(set_condition(existing, condition, self.clock()))}

        outcome = self.status.write(sb, merged, allowed_from=RUNNING_ONLY)
        log.info(
            "sandbox %s: Paused %s (%s), %s",
            key_of(sb),
            condition.status,
            condition.reason,
            outcome,
        )

    def _event(self, sb: Mapping[str, Any], reason: str, message: str) -> None:
        """Post an Event on its own thread: a slow API server never delays a stream."""
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Sandbox", **sb}

        def send() -> None:
            try:
                self.post_event(involved, "Normal", reason, f"{message} on node {self.node}")
            except Exception as exc:  # an Event is news, never a reason to fail the work
                log.warning("sandbox %s: event %s not posted: %s", key_of(sb), reason, exc)

        threading.Thread(target=send, name="idle-event", daemon=True).start()


def post_sandbox_event(
    objects: Objects,
    node: str,
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
) -> None:
    """An Event about a Sandbox on ``node``, reported from it (the write policy holds
    an agent to Events whose source.host is its own node)."""
    post_event(
        objects,
        involved,
        type_=type_,
        reason=reason,
        message=message,
        component="sandlot-agent",
        host=node,
    )


def _generation(sb: Mapping[str, Any]) -> int | None:
    return (sb.get("metadata") or {}).get("generation")


__all__ = ["IdlePauses", "cpu_used_ns", "post_sandbox_event"]
