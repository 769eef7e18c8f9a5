"""The ephemeral-storage pass: measure every live sandbox that has a disk limit and
stop the ones over it (``policy.ephemeralstorage`` decides).

What is measured is what the kubelet counts for a container: its writable layer
(the upper directory of its snapshot's overlay, which containerd names) and its
log files. The walk runs on the pass's own thread, capped in entries, so a slow
disk delays no start or stop. A sandbox over its limit is ended ``Failed`` first,
then killed without a grace period (the kubelet's eviction for local storage gives
none: the disk keeps filling during one); the stop runs on the sandbox pool under
its key, so the sync and the reaper leave it alone meanwhile. A status write that
did not go through leaves the container for the next pass to try again.

A growing sandbox is measured again sooner than the pass's interval: at half its
projected time to its limit (``policy.ephemeralstorage.next_check``); the loop
runs when the soonest such check is due and measures only the sandboxes due then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from sandlot.adapters.diskuse import disk_use
from sandlot.adapters.objects import Objects
from sandlot.adapters.runtime import UNSUPPORTED, ContainerInfo, Runtime, RuntimeError_, TaskState
from sandlot.adapters.statuswrite import WriteOutcome
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.sandboxes import SandboxWork
from sandlot.agent.status import StatusWriter
from sandlot.agent.workpools import SandboxPools
from sandlot.api.common import split_key
from sandlot.api.keys import SANDBOX_LABEL, SANDBOX_UID_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.ephemeralstorage import (
    MAX_ENTRIES,
    DiskUse,
    Sample,
    decide_storage,
    limit_of,
    next_check,
)
from sandlot.policy.sandboxlogs import LOG_SUFFIX, ROTATED_SUFFIX, log_stem

log = logging.getLogger(__name__)

_LIVE = frozenset({TaskState.RUNNING, TaskState.PAUSED})


class EphemeralStorage:
    """The pass; its sandbox operations and their status writes are ``work``'s."""

    def __init__(
        self,
        rt: Runtime,
        pool: SandboxPools,
        work: SandboxWork,
        log_dir: str,
        max_entries: int = MAX_ENTRIES,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rt = rt
        self.pool = pool
        self.work = work
        self.objects: Objects = work.objects
        self.status: StatusWriter = work.status
        self.metrics: AgentMetrics = work.metrics
        self.call_timeout = work.call_timeout
        self.log_dir = Path(log_dir) if log_dir else None  # "": logs are not kept
        self.max_entries = max_entries
        self.interval = interval
        self.clock = clock
        self._samples: dict[str, Sample] = {}
        self._due: dict[str, float] = {}
        """By container id, when it is measured next (on ``clock``)."""
        # A container's snapshot never changes: its directory is asked for once.
        self._layers: dict[str, str | None] = {}
        self.measured: dict[str, DiskUse] = {}
        """By container id, what the last pass found (the containers it measured)."""

    def pass_once(self) -> int:
        """Measure each live container with a limit; stop those over it. Returns how
        many stops were handed to the pool."""
        rt = self.rt
        now = self.clock()
        self.metrics.storage_passes.inc()
        live = {
            t.container_id
            for t in rt.list_tasks(timeout=self.call_timeout)
            if t.state in _LIVE  # an exited task is the reaper's
        }
        containers = rt.list_containers(timeout=self.call_timeout)
        self._layers = {cid: d for cid, d in self._layers.items() if cid in live}
        self._samples = {cid: x for cid, x in self._samples.items() if cid in live}
        self._due = {cid: at for cid, at in self._due.items() if cid in live}
        measured: dict[str, DiskUse] = {}
        stops = 0
        for container in containers:
            limit = limit_of(container.labels)
            key = container.labels.get(SANDBOX_LABEL, "")
            if limit is None or container.id not in live or "/" not in key:
                continue
            if self.pool.busy(key):
                continue  # a stop or a teardown is on its way
            if self._due.get(container.id, now) > now:
                continue  # measured recently, and not growing towards its limit fast
            trees = self.trees(rt, container)
            if trees is None:
                continue  # its layer is unknown this time: judged on the next pass
            use = disk_use(trees, self.max_entries)
            measured[container.id] = use
            sample = Sample(use.bytes, now)
            wait = next_check(self._samples.get(container.id), sample, limit, self.interval)
            self._samples[container.id] = sample
            self._due[container.id] = now + wait
            decision = decide_storage(use, limit)
            if decision.stop and self.pool.submit(
                key, partial(self._stop, key, container, decision.message)
            ):
                stops += 1
        self.measured = measured
        return stops

    def seconds_to_next(self) -> float:
        """Seconds until the soonest sandbox is due to be measured (the interval when
        none is sooner)."""
        soonest = min(self._due.values(), default=self.clock() + self.interval)
        return min(max(soonest - self.clock(), 0.0), self.interval)

    def step(self) -> float:
        """One pass, then the seconds until the next one is due (the loop's wait)."""
        self.pass_once()
        return self.seconds_to_next()

    def trees(self, rt: Runtime, container: ContainerInfo) -> list[Path] | None:
        """The writable layer (when its snapshotter has one) and the log files; None
        when containerd could not say now."""
        if not self.knows_layer(rt, container):
            return None
        layer = self._layers[container.id]
        trees = [Path(layer)] if layer is not None else []
        labels: Mapping[str, str] = container.labels
        if self.log_dir is not None and labels.get(SANDBOX_UID_LABEL):
            ns, name = split_key(labels[SANDBOX_LABEL])
            stem = log_stem(ns, name, labels[SANDBOX_UID_LABEL])
            trees += [
                self.log_dir / f"{stem}{LOG_SUFFIX}",
                self.log_dir / f"{stem}{ROTATED_SUFFIX}",
            ]
        return trees

    def layer(self, rt: Runtime, container: ContainerInfo) -> Path | None:
        """The writable layer's directory; None without one or when containerd could
        not say now (``knows_layer`` tells which)."""
        layer = self._layers.get(container.id) if self.knows_layer(rt, container) else None
        return Path(layer) if layer is not None else None

    def knows_layer(self, rt: Runtime, container: ContainerInfo) -> bool:
        """Whether ``container``'s writable layer is known (asked once: a container's
        snapshot never changes); False when containerd could not say now."""
        if container.id in self._layers:
            return True
        try:
            layer = rt.writable_layer(container.id, timeout=self.call_timeout)
        except RuntimeError_ as exc:
            log.warning("container %s: writable layer not found: %s", container.id, exc)
            if exc.code != UNSUPPORTED:
                return False
            layer = None  # for good (a snapshotter without one): its logs only
        self._layers[container.id] = layer
        return True

    def _stop(self, key: str, container: ContainerInfo, message: str) -> None:
        reason = SandboxReason.EPHEMERAL_STORAGE_EXCEEDED
        if self.end_for_disk(key, container, reason, message, ("stop", "stopping")):
            self.metrics.storage_exceeded.inc()

    def end_for_disk(
        self,
        key: str,
        container: ContainerInfo,
        reason: SandboxReason,
        message: str,
        verbs: tuple[str, str],
    ) -> bool:
        """End ``key``'s sandbox Failed for ``reason`` and tear ``container`` down, read
        again first: only while it is still the container's sandbox and Running.
        Whether it ended; ``verbs`` name the act in the log (``stop``, ``stopping``)."""
        verb, doing = verbs
        try:
            obj = self.objects.get_sandbox(*split_key(key))
        except Exception as exc:
            log.warning("sandbox %s: cannot read it to %s it: %s", key, verb, exc)
            return False  # deleted: the sync stops it; unreadable: the next pass tries again
        if obj["metadata"].get("uid") != container.labels.get(SANDBOX_UID_LABEL):
            return False  # another sandbox of that name now: its container is an orphan
        log.warning("sandbox %s: %s container %s: %s", key, doing, container.id, message)
        outcome = self.status.end(
            obj,
            SandboxPhase.FAILED,
            reason,
            message,
            allowed_from=frozenset({SandboxPhase.RUNNING}),
        )
        if outcome is not WriteOutcome.WRITTEN:
            return False
        self.work.teardown(container)
        return True


__all__ = ["EphemeralStorage"]
