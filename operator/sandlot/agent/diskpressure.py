"""The node's disk under pressure: every ``PRESSURE_TICK`` (a ``statvfs`` or two),
measure the fuller of containerd's root and the log directory; at or over the high
watermark run image GC first, then evict sandboxes (``policy.diskpressure`` chooses) down to the low
watermark.

An evicted sandbox ends ``Failed``, reason ``Evicted``, the message naming the
resource and both usages, then is killed without a grace period and torn down. A
removed snapshot's files are deleted by containerd's garbage collector later, so
an eviction ends with a collection: until then the disk does not show what it
freed. While an eviction is in flight nobody else is chosen: what it frees is
only seen once its container is gone and the collection ran, and choosing on the
old figure would evict a quiet neighbour for bytes already on their way out.
For the same reason the writable layers of sandboxes whose task has exited (a
teardown that did not finish, a container the reaper or the sweep will remove)
count as being freed, and before anyone is chosen containerd collects what
nothing references any more and the disk is measured again: live work is never
evicted for bytes that a teardown in flight or a collection gives back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from sandlot.adapters.diskuse import disk_use
from sandlot.adapters.runtime import ContainerInfo, Runtime, TaskState
from sandlot.agent.ephemeralstorage import EphemeralStorage
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.timestamps import rfc3339, utcnow
from sandlot.policy.diskpressure import (
    UNMEASURED_HOLD,
    Candidate,
    FsUse,
    PressureDecision,
    decide_pressure,
    fuller,
    pressure_holds,
    unmeasured_holds,
)
from sandlot.policy.ephemeralstorage import human_bytes, limit_of
from sandlot.policy.imagegc import DiskUsage

log = logging.getLogger(__name__)

PRESSURE_TICK = 0.25
"""Seconds between two measurements of the node's disk: a writer at full speed
fills a small disk in seconds, and a measurement costs two ``statvfs`` calls."""

_LIVE = frozenset({TaskState.RUNNING, TaskState.PAUSED})


class DiskPressure:
    """The pass; it evicts through the storage pass's pool, work and status writer."""

    def __init__(
        self,
        storage: EphemeralStorage,
        usages: Callable[[], Sequence[DiskUsage]],
        high: float,
        low: float,
        collect_images: Callable[[], object],
        transition: float = 300.0,
        on_change: Callable[[], object] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        publish: Callable[[dict[str, Any]], object] = lambda _: None,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self.storage = storage
        self.usages = usages
        """The filesystems holding containerd's root and the logs, measured now."""
        self.high = high
        self.low = low
        self.collect_images = collect_images
        self.transition = transition
        self.on_change = on_change
        """Called when the node starts or stops refusing new sandboxes."""
        self.clock = clock
        self.publish = publish
        """Writes ``status.disk`` on the node's SandboxNode (raises on failure)."""
        self.wall = wall
        self.since: datetime | None = None
        """When the node last started refusing, on the wall clock."""
        self._published: bool | None = False
        """The pressure ``status.disk`` says (registration writes False); None: unknown."""
        self.last_over: float | None = None
        self.last_use = FsUse(0, 0)
        self._refusing = False
        self.evicting: set[str] = set()
        """Keys of sandboxes whose eviction is on the pool."""
        self.last: PressureDecision = PressureDecision(pressure=False)
        self.unmeasured_since: float | None = None
        """Since when (on ``clock``) a pass could not measure some sandbox's layer."""

    def measure(self) -> FsUse:
        """The fuller of the filesystems ``usages`` gives."""
        return fuller(FsUse(u.used_bytes, u.total_bytes) for u in self.usages())

    def refusal(self) -> str:
        """Why a new sandbox is not started now ("" when it may be): the node was at or
        over its high watermark less than ``transition`` seconds ago."""
        if not pressure_holds(self.clock(), self.last_over, self.transition):
            return ""
        use = self.last_use
        return (
            f"the node is under disk pressure: its disk was {use.fraction:.0%} full "
            f"({human_bytes(use.used)} of {human_bytes(use.capacity)}, high watermark "
            f"{self.high:.0%}) within the last {self.transition:g}s; the sandbox starts "
            "once that clears"
        )

    def pass_once(self) -> PressureDecision:
        try:
            return self._pass()
        finally:
            refusing = bool(self.refusal())
            changed = refusing != self._refusing
            if changed:
                self._refusing = refusing
                self.since = self.wall() if refusing else None
            if refusing != self._published:
                self._publish(refusing)  # the node says so before a held start goes on
            if changed:
                self.on_change()

    def disk_status(self) -> dict[str, Any]:
        """``status.disk`` as it is now: the node refusing or not, since when, why."""
        if not self._refusing:
            return {"pressure": False, "since": None, "message": ""}
        use = self.last_use
        return {
            "pressure": True,
            "since": rfc3339(self.since) if self.since is not None else None,
            "usagePercent": round(use.fraction * 100, 1),
            "usedBytes": use.used,
            "capacityBytes": use.capacity,
            "message": self.refusal(),
        }

    def _publish(self, refusing: bool) -> None:
        """Write the transition; a failed write is retried at the next pass."""
        try:
            self.publish(self.disk_status())
        except Exception as exc:
            self._published = None
            log.warning("cannot write the node's disk pressure (%s): %s", refusing, exc)
        else:
            self._published = refusing

    def _pass(self) -> PressureDecision:
        use = self.measure()
        if use.fraction >= self.high:
            self.last_over, self.last_use = self.clock(), use
        if use.fraction < self.high:
            self.last = PressureDecision(pressure=False)
            return self.last
        self.collect_images()
        use = self.measure()
        if use.fraction >= self.high:  # image GC can take a while: still over now
            self.last_over, self.last_use = self.clock(), use
        pool = self.storage.pool
        self.evicting = {key for key in self.evicting if pool.busy(key)}
        if self.evicting:
            # what they free shows only once they are gone and collected
            self.last = decide_pressure(use, self.high, self.low, [])
            return PressureDecision(pressure=self.last.pressure)
        rt = self.storage.rt
        containers, freeing, unmeasured = self._candidates(rt)
        decision = decide_pressure(use, self.high, self.low, containers.keys(), freeing)
        if decision.evict:
            # judged again after a collection, on figures all taken after it: the
            # disk first, then the sandboxes (which only grow meanwhile, so what
            # evicting them frees is never underestimated)
            use = self._collected(rt, use)
            containers, freeing, unmeasured = self._candidates(rt)
            decision = decide_pressure(use, self.high, self.low, containers.keys(), freeing)
        now = self.clock()
        if not unmeasured:
            self.unmeasured_since = None
        elif self.unmeasured_since is None:
            self.unmeasured_since = now
        if decision.evict and unmeasured_holds(now, self.unmeasured_since, UNMEASURED_HOLD):
            log.warning(
                "disk pressure: containerd did not name the layer of %s; nobody evicted "
                "this pass (for at most %gs)", ", ".join(sorted(unmeasured)), UNMEASURED_HOLD
            )  # fmt: skip
            self.last = PressureDecision(pressure=True, to_free=decision.to_free)
            return self.last
        by_key = {c.key: containers[c] for c in containers}
        for eviction in decision.evict:
            container = by_key[eviction.key]
            work = partial(self._evict, eviction.key, container, eviction.message)
            if pool.submit(eviction.key, work):
                self.evicting.add(eviction.key)
        self.last = decision
        return decision

    def _collected(self, rt: Runtime, use: FsUse) -> FsUse:
        """The disk measured again after containerd collected what nothing references
        (a container the sweep removed leaves its snapshot's files until then); ``use``
        when the collection failed."""
        try:
            rt.collect_garbage(timeout=self.storage.call_timeout)
        except Exception as exc:
            log.warning("before evicting: containerd's collection failed: %s", exc)
            return use
        use = self.measure()
        if use.fraction >= self.high:
            self.last_over, self.last_use = self.clock(), use
        return use

    def _candidates(self, rt: Runtime) -> tuple[dict[Candidate, ContainerInfo], int, set[str]]:
        """The live sandboxes that may be evicted; the bytes in the writable layers of
        sandboxes whose task has exited (on their way out: a teardown or the sweep
        removes them); and the keys of sandboxes whose layer containerd did not name
        this time (neither counted)."""
        timeout = self.storage.call_timeout
        states = {t.container_id: t.state for t in rt.list_tasks(timeout=timeout)}
        found: dict[Candidate, ContainerInfo] = {}
        freeing = 0
        unmeasured: set[str] = set()
        for container in rt.list_containers(timeout=timeout):
            key = container.labels.get(SANDBOX_LABEL, "")
            if "/" not in key:
                continue
            state = states.get(container.id)
            if state is TaskState.STOPPED or (state is None and not self.storage.pool.busy(key)):
                layer = self._layer_bytes(rt, container)
                if layer is None:
                    unmeasured.add(key)
                freeing += layer or 0
                continue
            if state not in _LIVE or self.storage.pool.busy(key):
                continue
            use = self.storage.measured.get(container.id)
            if use is None:
                trees = self.storage.trees(rt, container)
                if trees is None:
                    unmeasured.add(key)
                    continue
                use = disk_use(trees, self.storage.max_entries)
            candidate = Candidate(key, usage=use.bytes, limit=limit_of(container.labels))
            found[candidate] = container
        return found, freeing, unmeasured

    def _layer_bytes(self, rt: Runtime, container: ContainerInfo) -> int | None:
        """The bytes in ``container``'s writable layer (its logs stay): 0 without one;
        None when containerd could not name it now."""
        if not self.storage.knows_layer(rt, container):
            return None
        layer = self.storage.layer(rt, container)
        return disk_use([layer], self.storage.max_entries).bytes if layer is not None else 0

    def _evict(self, key: str, container: ContainerInfo, message: str) -> None:
        storage = self.storage
        if not storage.end_for_disk(
            key, container, SandboxReason.EVICTED, message, ("evict", "evicting")
        ):
            return
        try:
            # its snapshot's files go only when containerd collects
            storage.rt.collect_garbage(timeout=storage.call_timeout)
        except Exception as exc:
            log.warning("after evicting %s: containerd's collection failed: %s", key, exc)


__all__ = ["PRESSURE_TICK", "DiskPressure"]
