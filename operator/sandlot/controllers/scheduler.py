"""The scheduler: a Pending sandbox without a node gets one.

The choice is ``sandlot.policy.scheduling.choose_node`` over a snapshot built from
memory: nodes from their watch events, their leases from the lease watch, and the
per-node counts from the sandbox cache. Binding writes ``spec.nodeName`` with the
sandbox's resourceVersion as precondition, then phase ``Scheduled`` through the
status subresource; a lost race re-reads and finds the sandbox bound, so no
sandbox is bound twice. The cache takes the answer at once, so the next choice
already counts it.

A sandbox nothing fits stays Pending with ``Scheduled=False``, reason
``Unschedulable`` and a message saying why, and waits: it is tried again only when
something may have made room (a node became Ready, was uncordoned or reported
more capacity; a bound sandbox ended or was deleted). There is no retry timer, so
a fleet with no room costs nothing while it stays so.

Decisions are made one at a time on one queue (each sees the previous one's
binding); only the leader binds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from sandlot.adapters.objects import LeaseRecord, Objects, parse_time, rfc3339
from sandlot.adapters.workloads import bind_sandbox, write_sandbox_status
from sandlot.api.common import GROUP, VERSION
from sandlot.api.node import NodePhase
from sandlot.api.sandbox import SandboxPhase
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord
from sandlot.policy.nodehealth import LeaseView, lease_expiry, observed_phase
from sandlot.policy.scheduling import Choice, NodeSlot, SandboxRequest, choose_node

log = logging.getLogger(__name__)

CONDITION = "Scheduled"
RETRY_AFTER_ERROR = 2.0
MAX_BIND_ATTEMPTS = 3


@dataclass(slots=True)
class NodeInfo:
    name: str
    unschedulable: bool
    capacity: int
    created_at: datetime


def _node_info(body: Mapping[str, Any]) -> NodeInfo:
    meta = body["metadata"]
    status = body.get("status") or {}
    return NodeInfo(
        name=meta["name"],
        unschedulable=bool((body.get("spec") or {}).get("unschedulable", False)),
        capacity=int((status.get("capacity") or {}).get("sandboxes") or 0),
        created_at=parse_time(meta.get("creationTimestamp")) or datetime.now(UTC),
    )


def scheduled_condition(status: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    return {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(now),
    }


def _with_condition(body: Mapping[str, Any], condition: dict[str, Any]) -> list[dict[str, Any]]:
    others = [
        c
        for c in (body.get("status") or {}).get("conditions") or []
        if c.get("type") != condition["type"]
    ]
    return [condition, *others]


class Scheduler:
    def __init__(
        self,
        objects: Objects,
        cache: SandboxCache,
        metrics: WorkloadMetrics,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.objects = objects
        self.cache = cache
        self.metrics = metrics
        self.is_leader = is_leader
        self.clock = clock
        self.nodes: dict[str, NodeInfo] = {}
        self.leases: dict[str, LeaseView] = {}
        self.waiting: dict[str, str] = {}  # unschedulable sandbox key -> message written
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        cache.listeners.append(self.on_sandbox)

    # -- inputs ---------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        name = body["metadata"]["name"]
        if event_type == "DELETED":
            self.nodes.pop(name, None)
            return
        old = self.nodes.get(name)
        new = _node_info(body)
        self.nodes[name] = new
        if (
            old is None
            or (old.unschedulable and not new.unschedulable)
            or new.capacity > old.capacity
            or (body.get("status") or {}).get("phase") == NodePhase.READY
        ):
            self.retry_waiting()

    def on_lease(self, event_type: str, lease: LeaseRecord) -> None:
        """Called from the lease watch thread."""
        view = (
            None
            if event_type == "DELETED"
            else LeaseView(renew_time=lease.renew_time, duration_seconds=lease.duration_seconds)
        )
        if self._loop is None:
            self._apply_lease(lease.name, view)
        else:
            self._loop.call_soon_threadsafe(self._apply_lease, lease.name, view)

    def _apply_lease(self, name: str, view: LeaseView | None) -> None:
        old = self.leases.get(name)
        if view is None:
            self.leases.pop(name, None)
            return
        self.leases[name] = view
        node = self.nodes.get(name)
        if node is None:
            return
        now = self.clock()
        # Only a node coming back to life makes room; a routine renewal does not.
        if now >= lease_expiry(old, node.created_at) and now < lease_expiry(view, node.created_at):
            self.retry_waiting()

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        if new is not None and (new.wants_node or _prebound_pending(new)):
            self.enqueue(new.key)
        elif old is not None:
            self.waiting.pop(old.key, None)
        if old is not None and old.holds_slot and (new is None or not new.holds_slot):
            self.retry_waiting()  # a slot was freed

    def enqueue(self, key: str) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def retry_waiting(self) -> None:
        for key in list(self.waiting):
            self.enqueue(key)

    def enqueue_all(self) -> None:
        for rec in self.cache:
            if rec.wants_node:
                self.enqueue(rec.key)

    # -- the worker -----------------------------------------------------------------

    async def run(self) -> None:
        self.bind_loop(asyncio.get_running_loop())
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            if not self.is_leader():
                continue
            try:
                await self.schedule(key)
            except Exception:
                log.exception("sandbox %s: scheduling failed; retrying", key)
                self.metrics.scheduling_attempts.labels(result="error").inc()
                asyncio.get_running_loop().call_later(RETRY_AFTER_ERROR, self.enqueue, key)
            self.metrics.unschedulable.set(len(self.waiting))

    def slots(self, now: datetime) -> list[NodeSlot]:
        slots = []
        for node in self.nodes.values():
            lease = self.leases.get(node.name)
            slots.append(
                NodeSlot(
                    name=node.name,
                    phase=observed_phase(node.unschedulable, lease, node.created_at, now),
                    unschedulable=node.unschedulable,
                    capacity=node.capacity,
                    sandboxes=self.cache.node_load.get(node.name, 0),
                    pool_members=self.cache.node_pool_load.get(node.name, {}),
                    ready_until=lease_expiry(lease, node.created_at),
                )
            )
        return slots

    def choose(self, rec: SandboxRecord, now: datetime) -> Choice:
        return choose_node(SandboxRequest(rec.key, rec.pool_key), self.slots(now), now)

    async def schedule(self, key: str) -> None:
        rec = self.cache.get(key)
        if rec is not None and _prebound_pending(rec) and rec.node not in self.nodes:
            # Bound by its author to a node that does not exist: say so, and wait for
            # the node (its agent may be about to register it); nothing else changes.
            message = (
                f'spec.nodeName names node "{rec.node}", which does not exist; the sandbox '
                "waits until a SandboxNode of that name registers"
            )
            await self._report_waiting(rec, "NodeNotFound", message, self.clock())
            return
        if rec is None or not rec.wants_node:
            self.waiting.pop(key, None)
            return
        now = self.clock()
        choice = self.choose(rec, now)
        if choice.node is None:
            await self._report_unschedulable(rec, choice, now)
            return
        self.waiting.pop(key, None)
        await self._bind(rec, choice.node, now)

    async def _bind(self, rec: SandboxRecord, node: str, now: datetime) -> None:
        rv = str(rec.resource_version)
        for _ in range(MAX_BIND_ATTEMPTS):
            result = await asyncio.to_thread(
                bind_sandbox, self.objects, rec.namespace, rec.name, node, rv
            )
            self.metrics.scheduling_attempts.labels(result=result.outcome).inc()
            if result.outcome == "gone":
                return
            assert result.body is not None
            if result.outcome == "taken":
                self.cache.upsert(result.body)
                return
            if result.outcome == "conflict":
                fresh = self.cache.upsert(result.body) or rec
                if not fresh.wants_node:
                    return
                rv = result.body["metadata"]["resourceVersion"]
                continue
            self.cache.upsert(result.body)
            log.info("sandbox %s bound to node %s", rec.key, node)
            await self._mark_scheduled(result.body, node, now)
            return
        self.enqueue(rec.key)  # still conflicting: decide afresh

    async def _mark_scheduled(self, body: dict[str, Any], node: str, now: datetime) -> None:
        condition = scheduled_condition("True", "Bound", f"bound to node {node}", now)
        meta = body["metadata"]
        for _ in range(MAX_BIND_ATTEMPTS):
            if (body.get("status") or {}).get("phase", SandboxPhase.PENDING) != (
                SandboxPhase.PENDING
            ):
                return  # the agent (or a Dead marking) got there first
            status = {
                "phase": SandboxPhase.SCHEDULED,
                "conditions": _with_condition(body, condition),
            }
            written = await asyncio.to_thread(
                write_sandbox_status,
                self.objects,
                meta["namespace"],
                meta["name"],
                status,
                body["metadata"]["resourceVersion"],
            )
            if written is not None:
                self.cache.upsert(written)
                return
            try:
                body = await asyncio.to_thread(
                    self.objects.get_sandbox, meta["namespace"], meta["name"]
                )
            except Exception:
                return  # gone; or the agent will still run it: Scheduled is a courtesy
        log.warning("sandbox %s/%s: phase Scheduled not written", meta["namespace"], meta["name"])

    async def _report_unschedulable(
        self, rec: SandboxRecord, choice: Choice, now: datetime
    ) -> None:
        self.metrics.scheduling_attempts.labels(result="unschedulable").inc()
        await self._report_waiting(rec, "Unschedulable", choice.message, now)

    async def _report_waiting(
        self, rec: SandboxRecord, reason: str, message: str, now: datetime
    ) -> None:
        if self.waiting.get(rec.key) == message:
            return
        log.info("sandbox %s waits (%s): %s", rec.key, reason, message)
        condition = scheduled_condition("False", reason, message, now)
        # Read once for an exact merge of the other conditions (a rare write: only
        # when the reason changes).
        try:
            body = await asyncio.to_thread(self.objects.get_sandbox, rec.namespace, rec.name)
        except Exception:
            return  # gone (its DELETED event follows) or unreadable: the next event retries
        fresh = self.cache.upsert(body) or rec
        if not (fresh.wants_node or _prebound_pending(fresh)):
            return
        written = await asyncio.to_thread(
            write_sandbox_status,
            self.objects,
            rec.namespace,
            rec.name,
            {"conditions": _with_condition(body, condition)},
            body["metadata"]["resourceVersion"],
        )
        if written is not None:
            self.waiting[rec.key] = message
            self.cache.upsert(written)
        else:
            self.waiting[rec.key] = ""  # changed meanwhile: judge the new version
            self.enqueue(rec.key)


def _prebound_pending(rec: SandboxRecord) -> bool:
    """Created with spec.nodeName already set and not yet picked up by that node's agent."""
    return rec.node is not None and rec.phase == SandboxPhase.PENDING


def register(registry: kopf.OperatorRegistry, scheduler: Scheduler) -> None:
    @kopf.on.event(GROUP, VERSION, "sandboxnodes", registry=registry)
    async def scheduler_node_event(body: kopf.Body, **kwargs: Any) -> None:
        scheduler.on_node(kwargs.get("type"), body)
