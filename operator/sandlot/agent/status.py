"""The status bodies the agent writes and the one way it writes them.

Every write goes through ``adapters.statuswrite.write_status`` bound to this node:
carrying the resourceVersion the decision was made on, and never onto a Sandbox
that became terminal, was deleted, or was replaced by another of the same name
(new uid, other node) meanwhile. The caller learns which from the outcome.

A write that failed holds its Sandbox back from the sync for a while
(``policy.writebackoff``): a refused write is not retried, with a start before
it, on every pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from sandlot.adapters.objects import Objects
from sandlot.adapters.statuswrite import StatusFor, WriteOutcome, write_status
from sandlot.api.common import key_of
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import rfc3339
from sandlot.policy.marking import ended_status
from sandlot.policy.writebackoff import Hold, is_held, next_hold

log = logging.getLogger(__name__)


def running(node: str, container_id: str, pid: int, ip: str, now: datetime) -> dict[str, Any]:
    """The status a started sandbox gets: where it runs and since when."""
    return {
        "phase": SandboxPhase.RUNNING.value,
        "reason": SandboxReason.STARTED.value,
        "message": f"running on node {node}",
        "containerId": container_id,
        "pid": pid,
        "ip": ip,
        "startedAt": rfc3339(now),
        "imagePull": None,  # the pull, if any, is over
    }


class StatusWriter:
    """Status writes for this node's Sandboxes, with their outcome logged once here."""

    def __init__(
        self,
        objects: Objects,
        node: str,
        clock: Callable[[], datetime],
        observe: Callable[[Mapping[str, Any]], object] | None = None,
        latest: Callable[[str], Mapping[str, Any] | None] = lambda _key: None,
    ) -> None:
        self.objects = objects
        self.node = node
        self.clock = clock
        self.observe = observe  # handed every Sandbox as a write returned it
        # The watch's latest view of a Sandbox by key: a write decided on an older
        # version starts from it, not from the 409 that version is sure to get.
        self.latest = latest
        self._holds: dict[str, Hold] = {}
        self._lock = threading.Lock()

    def held(self, resource_versions: Mapping[str, str]) -> set[str]:
        """The keys (of ``{key: resourceVersion}``) the sync leaves alone now."""
        now = self.clock()
        with self._lock:
            return {
                key
                for key, version in resource_versions.items()
                if is_held(self._holds.get(key), version, now)
            }

    def _note(self, obj: Mapping[str, Any], outcome: WriteOutcome) -> None:
        key = key_of(obj)
        with self._lock:
            if outcome in (WriteOutcome.REFUSED, WriteOutcome.FAILED, WriteOutcome.CONFLICTED):
                version = str(obj["metadata"].get("resourceVersion") or "")
                refused = outcome is WriteOutcome.REFUSED
                hold = next_hold(self._holds.get(key), version, self.clock(), refused=refused)
                self._holds[key] = hold
                log.warning(
                    "sandbox %s: left alone until %s after %d failed status write(s)",
                    key,
                    hold.until.isoformat(),
                    hold.failures,
                )
            else:
                self._holds.pop(key, None)

    def write(
        self,
        obj: Mapping[str, Any],
        status: Mapping[str, Any] | StatusFor,
        *,
        allowed_from: Collection[SandboxPhase] | None = None,
    ) -> WriteOutcome:
        result = write_status(
            self.objects,
            obj,
            status,
            node=self.node,
            allowed_from=allowed_from,
            latest=self.latest(key_of(obj)),
        )
        if result.outcome in (WriteOutcome.FAILED, WriteOutcome.CONFLICTED, WriteOutcome.REFUSED):
            log.warning(
                "sandbox %s: status write %s: %s", key_of(obj), result.outcome, result.detail
            )
        self._note(obj, result.outcome)
        if result.written is not None and self.observe is not None:
            self.observe(result.written)
        return result.outcome

    def end(
        self,
        obj: Mapping[str, Any],
        phase: SandboxPhase,
        reason: str,
        message: str,
        exit_code: int | None = None,
        *,
        allowed_from: Collection[SandboxPhase] | None = None,
    ) -> WriteOutcome:
        """End ``obj`` in ``phase`` (timestamped now)."""
        body = ended_status(phase, reason, message, self.clock(), exit_code)
        return self.write(obj, body, allowed_from=allowed_from)


class NodeSandboxCount:
    """Keeps ``status.sandboxes`` of this node's SandboxNode equal to what the sync
    counted: one patch when the count changes, none otherwise; a failed patch is
    tried again at the next pass."""

    def __init__(self, objects: Objects, node: str) -> None:
        self.objects = objects
        self.node = node
        self.written: int | None = None

    def report(self, count: int) -> None:
        if count == self.written:
            return
        try:
            self.objects.patch_node_status(self.node, {"sandboxes": count})
        except Exception as e:
            log.warning("node %s: cannot write status.sandboxes=%d: %s", self.node, count, e)
            self.written = None
            return
        self.written = count


__all__ = [
    "NodeSandboxCount",
    "StatusWriter",
    "running",
]
