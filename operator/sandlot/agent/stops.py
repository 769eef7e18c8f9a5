"""Stopping this node's sandboxes and tearing their containers down: a deleted
sandbox, a drained node, one something else ended (its lifetime, a user), one whose
container is gone.

A graceful stop is SIGTERM, the sandbox's grace, then the teardown
(``agent.teardown``: every containerd call bounded, concurrent with a cap). The
agent stopping during a grace leaves that stop: the next agent finds the sandbox as
it was and stops it again. An end is written on the Sandbox read again after its
stop, with the resourceVersion of that read, so a deleted one gets none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from functools import partial
from typing import Any

from sandlot.adapters.agentapi import is_not_found
from sandlot.adapters.objects import Objects
from sandlot.adapters.runtime import ContainerInfo, Runtime
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.network import Networking
from sandlot.agent.settings import AgentSettings
from sandlot.agent.status import StatusWriter
from sandlot.agent.teardown import StopInterrupted, TeardownResult, stop, teardown
from sandlot.api.common import key_of, split_key
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.agentsync import UNSTARTED_PHASES
from sandlot.policy.suspension import recorded_suspended

log = logging.getLogger(__name__)

# Running bodies a start made but could not write yet, by key: (container id,
# status). Only the work item of that key touches its entry (one operation per key
# at a time); a start keeps it, a later pass writes it, a deletion drops it.
Unwritten = dict[str, tuple[str, dict[str, Any]]]


class Stops:
    """This node's stops and teardowns on ``rt``, the connected runtime."""

    def __init__(
        self,
        settings: AgentSettings,
        objects: Objects,
        rt: Runtime,
        networking: Networking,
        status: StatusWriter,
        metrics: AgentMetrics,
        cancel: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.node = settings.node_name
        self.objects = objects
        self.rt = rt
        self.networking = networking
        self.status = status
        self.metrics = metrics
        # The Running bodies ``Starts`` could not write yet; a deletion drops its own.
        self.unwritten: Unwritten = {}
        self._cancel = cancel
        self.kill_wait = settings.kill_wait.total_seconds()
        self.call_timeout = settings.call_timeout.total_seconds()

    def count_teardown(self, result: TeardownResult) -> None:
        self.metrics.teardowns.labels(result.outcome.value).inc()

    def teardown(
        self, container: ContainerInfo | str, *, release_patience: float = -1
    ) -> TeardownResult:
        return teardown(
            self.rt,
            container,
            kill_wait=self.kill_wait,
            call_timeout=self.call_timeout,
            on_done=self.count_teardown,
            release=partial(self.networking.release, patience=release_patience),
        )

    def _graceful_stop(self, container: ContainerInfo | str, grace: float) -> TeardownResult | None:
        """The stop; None when the agent stopped during the grace (the next agent
        finds the sandbox as it was and stops it again)."""
        try:
            return stop(
                self.rt,
                container,
                stop_grace=grace,
                kill_wait=self.kill_wait,
                call_timeout=self.call_timeout,
                on_done=self.count_teardown,
                release=self.networking.release,
                cancel=self._cancel,
            )
        except StopInterrupted:
            log.info("container %s: agent stopping; its graceful stop is left", container)
            return None

    def _grace(self, sb: Mapping[str, Any]) -> float:
        seconds = (sb.get("spec") or {}).get("terminationGracePeriodSeconds")
        return float(seconds) if seconds is not None else self.settings.stop_grace.total_seconds()

    def read_again(self, key: str, container: ContainerInfo) -> dict[str, Any] | None:
        """The Sandbox now, before a destructive step planned on the watched view; None
        when gone (``container`` then stopped as deleted) or unreadable (logged)."""
        try:
            return self.objects.get_sandbox(*split_key(key))
        except Exception as exc:
            if is_not_found(exc):
                self.stop_deleted(key, container)
            else:
                log.warning("sandbox %s: cannot read it again before acting: %s", key, exc)
            return None

    def stop_deleted(self, key: str, container: ContainerInfo) -> None:
        self.unwritten.pop(key, None)
        log.info("sandbox %s is gone: stopping container %s", key, container.id)
        self._graceful_stop(container, self.settings.stop_grace.total_seconds())

    def refuse_drained(self, sb: Mapping[str, Any], reason: str) -> None:
        self.status.end(
            sb,
            SandboxPhase.STOPPED,
            reason,
            f"node {self.node} is drained",
            allowed_from=UNSTARTED_PHASES,
        )

    def end_drained(self, sb: Mapping[str, Any], reason: str) -> None:
        """End a suspended sandbox (no container) on this drained node."""
        self.status.end(
            sb,
            SandboxPhase.STOPPED,
            reason,
            f"node {self.node} is drained (the sandbox was suspended there)",
            allowed_from=frozenset({SandboxPhase.RUNNING}),
        )

    def stop_sandbox(self, sb: Mapping[str, Any], container: ContainerInfo, reason: str) -> None:
        key = key_of(sb)
        log.info("sandbox %s: stopping container %s (%s)", key, container.id, reason)
        result = self._graceful_stop(container, self._grace(sb))
        if result is None:
            return
        code = result.exit_status.code if result.exit_status else None
        try:
            current = self.objects.get_sandbox(*split_key(key))
        except Exception:
            return  # deleted meanwhile: nothing to record
        self.status.end(current, SandboxPhase.STOPPED, reason, f"stopped on node {self.node}", code)

    def stop_ended(self, sb: Mapping[str, Any], container: ContainerInfo) -> None:
        """A sandbox something else ended (its lifetime, a user) while its container
        runs: SIGTERM and its grace, then the teardown; its status stays as written."""
        log.info("sandbox %s has ended: stopping container %s", key_of(sb), container.id)
        self._graceful_stop(container, self._grace(sb))

    def end_lost(self, key: str) -> None:
        ns, name = split_key(key)
        try:
            obj = self.objects.get_sandbox(ns, name)
        except Exception as exc:
            log.warning("sandbox %s: cannot read it to end it: %s", key, exc)
            return
        if recorded_suspended(obj):
            return  # suspended meanwhile: its container was removed on purpose
        log.warning("sandbox %s was Running here but its container is gone", key)
        self.status.end(
            obj,
            SandboxPhase.STOPPED,
            SandboxReason.CONTAINER_LOST,
            f"container gone from node {self.node}",
            allowed_from=frozenset({SandboxPhase.RUNNING}),
        )


__all__ = ["Stops", "Unwritten"]
