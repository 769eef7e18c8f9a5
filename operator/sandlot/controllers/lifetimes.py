"""Ends sandboxes whose lifetime is over: ``Stopped``, reason ``DeadlineExceeded``,
or deleted under ``shutdownPolicy: Delete``; deletes finished sandboxes past
their ``ttlSecondsAfterFinished``.

The deadline of each sandbox is in its cache record (``policy.lifetimes``); the
decision is ``policy.lifetimes.decide_lifetime`` on the operator's clock. A
sandbox with a deadline ahead is put back on the work queue for exactly that
moment (``reconcile`` answers the seconds left), so it ends at that second
without a poll. The write is a status patch with the resourceVersion it was
decided on: a sandbox that changed meanwhile comes back through its watch event
and is judged again, a terminal one is left alone (the API server would refuse
it anyway). The node's agent sees the terminal phase beside a live container and
stops it, as it does for any sandbox ended while it runs. A deletion carries the
uid and resourceVersion it was decided on, for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from sandlot.adapters.workloads import WorkloadApi
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import rfc3339, utcnow
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord
from sandlot.controllers.workqueue import WorkQueue
from sandlot.policy.lifetimes import decide_lifetime
from sandlot.policy.marking import ended_status

log = logging.getLogger(__name__)

RETRY_AFTER_ERROR = 1.0
RETRY_CAP = 30.0


class LifetimeController:
    def __init__(
        self,
        api: WorkloadApi,
        cache: SandboxCache,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = utcnow,
        queue_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.cache = cache
        self.is_leader = is_leader
        self.clock = clock
        self.expired = 0
        self.deleted = 0
        self.queue = WorkQueue(
            "lifetime",
            self.reconcile,
            is_leader=is_leader,
            clock=queue_clock,
            backoff_start=RETRY_AFTER_ERROR,
            backoff_cap=RETRY_CAP,
        )
        cache.listeners.append(self.on_sandbox)

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        if new is None:
            if old is not None:
                self.queue.forget(old.key)
            return
        if _watched(new):
            self.queue.add(new.key)

    def enqueue_all(self) -> None:
        self.queue.add_all(r.key for r in self.cache if _watched(r))

    async def run(self) -> None:
        await self.queue.run()

    async def reconcile(self, key: str) -> float | None:
        rec = self.cache.get(key)
        if rec is None:
            return None
        now = self.clock()
        decision = decide_lifetime(rec.phase, rec.deadline, now, rec.ending, rec.finished_at)
        if not (decision.expire or decision.delete or decision.stamp_finished):
            return decision.wait_seconds
        if not self.is_leader():
            return None
        if decision.delete:
            await self._delete(rec, decision.message)
            return None
        if decision.stamp_finished:
            status: dict[str, str] = {"finishedAt": rfc3339(now)}
        else:
            reason = SandboxReason.DEADLINE_EXCEEDED
            status = ended_status(SandboxPhase.STOPPED, reason, decision.message, now)
        written = await asyncio.to_thread(
            self.api.write_status, rec.namespace, rec.name, status, str(rec.resource_version)
        )
        if written is None:
            return None  # changed or gone meanwhile: its watch event brings it back
        if decision.expire:
            self.expired += 1
            log.info(
                "sandbox %s: %s; Stopped (%s)",
                key,
                decision.message,
                SandboxReason.DEADLINE_EXCEEDED,
            )
        self.cache.upsert(written)
        return None

    async def _delete(self, rec: SandboxRecord, message: str) -> None:
        deleted = await asyncio.to_thread(
            self.api.delete_sandbox, rec.namespace, rec.name, rec.uid, rec.resource_version
        )
        if deleted:  # else changed or gone meanwhile: its watch event brings it back
            self.deleted += 1
            self.cache.forget(rec.key, rec.uid)
            log.info("sandbox %s: %s; deleted", rec.key, message)


def _watched(rec: SandboxRecord) -> bool:
    """A record with a moment ahead for this controller: a deadline or a TTL."""
    if rec.terminal:
        return rec.ending.ttl_seconds is not None and not rec.ending.kept_by_pool
    return rec.deadline is not None


__all__ = ["LifetimeController"]
