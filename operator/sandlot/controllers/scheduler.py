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

A fork (``spec.snapshotRef``) goes only to its snapshot's node, once the snapshot
is Ready; until then it stays Pending, reason ``SnapshotNotReady``, looked at
again every ``RETRY_FORK`` seconds (every ``RETRY_CLASS`` while the snapshot is
Failed: one of that name may be made again).

A node's taints and handlers are what ``policy.nodetrust`` trusts: taints from the
SandboxNode's spec and the Kubernetes Node (watched here; no agent writes it), never
the agent's mirror while the Node exists; a handler other than ``runc`` only when
the Node confirms it. The scheduler acts only once the Nodes are listed.

A sandbox with ``spec.runtimeClassName`` goes only to nodes whose trusted
handlers have its class's handler, with the class's node
selector and tolerations joined to its own; a missing or unusable class keeps it
Pending, its reason the agent's (``RuntimeClassNotFound``, ``InvalidRuntimeClass``),
and it is looked at again every ``RETRY_CLASS`` seconds (RuntimeClasses are not
watched).

A sandbox whose suspended state was pushed is moved to another node when its own
cannot start it (``policy.statemove.move_wanted``): cordoned or gone at once, lost
only once node health handled the node (its ``handledAt`` latch: grace over, the
mass-failure guard not holding), the moment a Dead marking would come. The node's
event that sets the latch looks at its sandboxes again.

Decisions are made one at a time by one ``WorkQueue`` worker (each sees the
previous one's binding), keyed by sandbox; only the leader binds. An API error
is retried with the queue's per-key backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import kopf

from sandlot.adapters.workloads import WorkloadApi
from sandlot.api.common import GROUP, KUBE_NODES, NODES, VERSION, Condition
from sandlot.api.node import NodeHealthTracking, NodePhase
from sandlot.api.placement import Taint
from sandlot.api.reasons import ConditionType, ScheduledReason, SnapshotReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import utcnow
from sandlot.controllers.kopfhandlers import forward_events
from sandlot.controllers.liveness import LivenessView
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord
from sandlot.controllers.workqueue import WorkQueue
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions
from sandlot.policy.nodehealth import episode_handled
from sandlot.policy.nodetrust import (
    KubeNodeFacts,
    class_selector_holds,
    kube_node_facts,
    trusted_handlers,
    trusted_taints,
)
from sandlot.policy.runtimeclass import (
    RuntimeClassInfo,
    RuntimeClassRefused,
    joined_placement,
    read_runtime_class,
)
from sandlot.policy.scheduling import Choice, NodeSlot, SandboxRequest, choose_node
from sandlot.policy.snapshots import fork_placement
from sandlot.policy.statemove import move_wanted

log = logging.getLogger(__name__)

RETRY_AFTER_ERROR = 2.0  # first retry after an API error; doubles up to RETRY_CAP
RETRY_CAP = 60.0
MAX_BIND_ATTEMPTS = 3
CLASS_TTL = 5.0  # seconds a RuntimeClass read is reused
RETRY_FORK = 1.0  # a fork whose snapshot is not Ready yet is looked at again (not watched)
RETRY_CLASS = 10.0  # a sandbox whose RuntimeClass is missing or unusable is tried again


@dataclass(slots=True)
class NodeInfo:
    name: str
    unschedulable: bool
    capacity: int
    tracking: NodeHealthTracking
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    """``spec.taints``: the admins'."""
    mirrored_taints: tuple[Taint, ...] = ()
    """``status.nodeTaints``: the agent's mirror, trusted only without a Node."""
    runtime_handlers: frozenset[str] = frozenset()
    """``status.runtimeHandlers``: what the agent offers, not yet trusted."""
    disk_pressure: bool = False


def _node_info(body: Mapping[str, Any]) -> NodeInfo:
    meta = body["metadata"]
    status = body.get("status") or {}
    return NodeInfo(
        name=meta["name"],
        unschedulable=bool((body.get("spec") or {}).get("unschedulable", False)),
        capacity=int((status.get("capacity") or {}).get("sandboxes") or 0),
        tracking=NodeHealthTracking.model_validate(status.get("health") or {}),
        labels=dict(meta.get("labels") or {}),
        taints=_taints((body.get("spec") or {}).get("taints")),
        mirrored_taints=_taints(status.get("nodeTaints")),
        runtime_handlers=frozenset(
            str(h.get("name")) for h in status.get("runtimeHandlers") or [] if h.get("name")
        ),
        disk_pressure=any(
            c.get("type") == ConditionType.DISK_PRESSURE and c.get("status") == "True"
            for c in status.get("conditions") or []
            if isinstance(c, Mapping)
        ),
    )


def _taints(raw: Any) -> tuple[Taint, ...]:
    return tuple(Taint.model_validate(t) for t in raw or ())


def with_scheduled(
    body: Mapping[str, Any],
    status: Literal["True", "False"],
    reason: str,
    message: str,
    now: datetime,
) -> list[dict[str, Any]]:
    """The sandbox's conditions with ``Scheduled`` set (the others as they are)."""
    current = parse_conditions((body.get("status") or {}).get("conditions"))
    new = Condition(type=ConditionType.SCHEDULED, status=status, reason=reason, message=message)
    return wire_conditions(set_condition(current, new, now))


class Scheduler:
    def __init__(
        self,
        api: WorkloadApi,
        cache: SandboxCache,
        metrics: WorkloadMetrics,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = utcnow,
        queue_clock: Callable[[], float] = time.monotonic,
        liveness: LivenessView,
    ) -> None:
        self.api = api
        self.cache = cache
        self.metrics = metrics
        self.is_leader = is_leader
        self.clock = clock
        self.nodes: dict[str, NodeInfo] = {}
        self.seen_nodes: set[str] = set()  # every node handed over, deleted ones too
        self.kube_nodes: dict[str, KubeNodeFacts] = {}  # Kubernetes Nodes, by name
        self.seen_kube_nodes: set[str] = set()
        self._phases: dict[str, str | None] = {}  # status.phase last seen, by node
        # The node-health controller's view of liveness: both judge READY alike.
        self.liveness = liveness
        self.waiting: dict[str, str] = {}  # unschedulable sandbox key -> message written
        self._classes: dict[str, tuple[float, Mapping[str, Any] | None]] = {}
        self.queue = WorkQueue(
            "sandbox",
            self.reconcile,
            is_leader=is_leader,
            clock=queue_clock,
            backoff_start=RETRY_AFTER_ERROR,
            backoff_cap=RETRY_CAP,
        )
        cache.listeners.append(self.on_sandbox)
        # Only a node coming back to life makes room; a routine renewal does not.
        self.liveness.subscribe(lambda name: self.queue.call_threadsafe(self._revived, name))

    # -- inputs ---------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.queue.bind_loop(loop)

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        name = body["metadata"]["name"]
        self.seen_nodes.add(name)
        if event_type == "DELETED":
            self.nodes.pop(name, None)
            self._phases.pop(name, None)
            self.move_from(name)
            return
        old = self.nodes.get(name)
        new = _node_info(body)
        self.nodes[name] = new
        phase = (body.get("status") or {}).get("phase")
        newly_handled = new.tracking.handled_at is not None and (
            old is None or old.tracking.handled_at != new.tracking.handled_at
        )
        if (new.unschedulable and (old is None or not old.unschedulable)) or (
            phase == NodePhase.NOT_READY and (self._phases.get(name) != phase or newly_handled)
        ):
            self.move_from(name)  # drained or lost: what was pushed may go elsewhere
        self._phases[name] = phase
        if (
            old is None
            or (old.unschedulable and not new.unschedulable)
            or new.capacity > old.capacity
            or new.runtime_handlers - old.runtime_handlers
            or (old.disk_pressure and not new.disk_pressure)
            or (body.get("status") or {}).get("phase") == NodePhase.READY
        ):
            self.retry_waiting()

    def on_kube_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A Kubernetes Node's event: its taints and labels are what placement trusts."""
        name = body["metadata"]["name"]
        self.seen_kube_nodes.add(name)
        old = self.kube_nodes.get(name)
        if event_type == "DELETED":
            self.kube_nodes.pop(name, None)
            return
        new = kube_node_facts(body)
        self.kube_nodes[name] = new
        if old is None or old != new:
            self.retry_waiting()  # a taint removed or a label added may make room

    def _revived(self, name: str) -> None:
        if name in self.nodes:
            self.retry_waiting()

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        if new is not None and (new.wants_node or _prebound_pending(new) or new.movable):
            self.enqueue(new.key)
        elif old is not None:
            self.waiting.pop(old.key, None)
            if new is None:
                self.queue.forget(old.key)
        if old is not None and old.holds_slot and (new is None or not new.holds_slot):
            self.retry_waiting()  # a slot was freed

    def move_from(self, node: str) -> None:
        """Look again at the sandboxes on ``node`` whose state was pushed: it was
        cordoned, went NotReady, or node health handled it (``_move`` decides)."""
        self.queue.add_all([r.key for r in self.cache if r.node == node and r.movable])

    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def retry_waiting(self) -> None:
        self.queue.add_all(list(self.waiting))

    def enqueue_all(self) -> None:
        """Everything ``on_sandbox`` would add: a new leader's queue starts empty (a
        standby's drops its work), and the sandbox feed delivered most sandboxes
        before this replica led."""
        self.queue.add_all(
            [
                rec.key
                for rec in self.cache
                if rec.wants_node or _prebound_pending(rec) or rec.movable
            ]
        )

    # -- the worker -----------------------------------------------------------------

    async def run(self) -> None:
        await self.queue.run()

    async def reconcile(self, key: str) -> float | None:
        """Place sandbox ``key`` if it waits for a node; seconds until it is due again."""
        try:
            return await self.schedule(key)
        except Exception:
            self.metrics.scheduling_attempts.labels(result="error").inc()
            raise  # the queue retries it with its backoff
        finally:
            self.metrics.unschedulable.set(len(self.waiting))

    def slots(
        self, now: datetime, class_selector: tuple[tuple[str, str], ...] = ()
    ) -> list[NodeSlot]:
        """Every node as the placement policy sees it; ``now`` on the liveness clock,
        ``class_selector`` the RuntimeClass's node selector (it may confirm a handler)."""
        slots = []
        for node in self.nodes.values():
            tracking = self.liveness.from_status(node.name, node.tracking)
            kube = self.kube_nodes.get(node.name)
            slots.append(
                NodeSlot(
                    name=node.name,
                    phase=self.liveness.phase(node.name, node.unschedulable, tracking, now),
                    unschedulable=node.unschedulable,
                    capacity=node.capacity,
                    sandboxes=self.cache.node_load.get(node.name, 0),
                    pool_members=self.cache.node_pool_load.get(node.name, {}),
                    ready_until=self.liveness.expiry(node.name, tracking),
                    labels=node.labels,
                    taints=trusted_taints(node.taints, node.mirrored_taints, kube),
                    runtime_handlers=trusted_handlers(node.runtime_handlers, kube, class_selector),
                    disk_pressure=node.disk_pressure,
                )
            )
        return slots

    def node_ready(self, name: str) -> bool:
        """Node ``name`` is READY now, as placement judges it: a pool member elsewhere
        serves nobody and does not count as available in a rollout."""
        node = self.nodes.get(name)
        if node is None:
            return False
        tracking = self.liveness.from_status(name, node.tracking)
        phase = self.liveness.phase(name, node.unschedulable, tracking, self.liveness.clock())
        return phase == NodePhase.READY

    async def runtime_class(self, name: str) -> RuntimeClassInfo:
        """The RuntimeClass ``name``, read at most every ``CLASS_TTL`` seconds; raises
        ``RuntimeClassRefused`` when it is missing or cannot be honoured."""
        now = time.monotonic()
        kept = self._classes.get(name)
        if kept is not None and now - kept[0] < CLASS_TTL:
            body = kept[1]
        else:
            body = await asyncio.to_thread(self.api.get_runtime_class, name)
            self._classes[name] = (now, body)
        return read_runtime_class(name, body)

    def choose(
        self,
        rec: SandboxRecord,
        runtime_class: RuntimeClassInfo | None = None,
        *,
        only: str | None = None,
        leaving: str | None = None,
    ) -> Choice:
        """A node for ``rec``: ``only`` that one if set (a fork's snapshot's node);
        ``leaving``: the node it moves away from (never chosen)."""
        placement, handler = rec.placement, None
        selector: tuple[tuple[str, str], ...] = ()
        if runtime_class is not None:
            placement = joined_placement(rec.placement, runtime_class)
            handler, selector = runtime_class.handler, runtime_class.node_selector
        request = SandboxRequest(rec.key, rec.pool_key, placement, handler)
        # Liveness is judged on its own steady clock, never on the wall clock.
        now = self.liveness.clock()
        slots = [
            slot
            for slot in self.slots(now, selector)
            if (only is None or slot.name == only)
            and slot.name != leaving
            and class_selector_holds(selector, slot.labels, self.kube_nodes.get(slot.name))
        ]
        return choose_node(request, slots, now)

    async def schedule(self, key: str) -> float | None:
        rec = self.cache.get(key)
        if rec is not None and rec.movable and rec.node is not None:
            return await self._move(rec, rec.node)
        if rec is not None and _prebound_pending(rec) and rec.node not in self.nodes:
            # Bound by its author to a node that does not exist: say so, and wait for
            # the node (its agent may be about to register it); nothing else changes.
            message = (
                f'spec.nodeName names node "{rec.node}", which does not exist; the sandbox '
                "waits until a SandboxNode of that name registers"
            )
            return await self._report_waiting(
                rec, ScheduledReason.NODE_NOT_FOUND, message, self.clock()
            )
        if rec is None or not rec.wants_node:
            self.waiting.pop(key, None)
            return None
        now = self.clock()
        runtime_class = None
        if rec.runtime_class:
            try:
                runtime_class = await self.runtime_class(rec.runtime_class)
            except RuntimeClassRefused as exc:
                self.metrics.scheduling_attempts.labels(result="unschedulable").inc()
                await self._report_waiting(rec, exc.reason, str(exc), now)
                return RETRY_CLASS  # no watch on RuntimeClasses: look again later
        only, anywhere = None, False
        if rec.snapshot:  # a fork goes to its snapshot's node once the snapshot is Ready
            snapshot = await asyncio.to_thread(self.api.get_snapshot, rec.namespace, rec.snapshot)
            fork = fork_placement(rec.snapshot, snapshot)
            if fork.node is None:
                why = fork.fail or fork.wait or ""
                await self._report_waiting(rec, SnapshotReason.SNAPSHOT_NOT_READY, why, now)
                return RETRY_FORK if fork.fail is None else RETRY_CLASS
            only, anywhere = fork.node, fork.anywhere
        choice = self.choose(rec, runtime_class, only=only)
        if choice.node is None and anywhere:  # pushed: another node pulls it
            choice = self.choose(rec, runtime_class)
        if choice.node is None:
            self.metrics.scheduling_attempts.labels(result="unschedulable").inc()
            return await self._report_waiting(
                rec, ScheduledReason.UNSCHEDULABLE, choice.message, now
            )
        self.waiting.pop(key, None)
        return await self._bind(rec, choice.node, now)

    async def _move(self, rec: SandboxRecord, node: str) -> float | None:
        """Bind a sandbox whose pushed state its node cannot start to another node."""
        slot = self.nodes.get(node)
        phase, handled = None, False
        if slot is not None:
            tracking = self.liveness.from_status(node, slot.tracking)
            phase = self.liveness.phase(node, slot.unschedulable, tracking, self.liveness.clock())
            # Lost: moved only once node health handled it (grace over, guard not holding).
            handled = episode_handled(tracking, self.liveness.expiry(node, tracking))
        if not move_wanted(rec.movable, phase, handled):
            self.waiting.pop(rec.key, None)
            return None
        runtime_class = None
        if rec.runtime_class:
            try:
                runtime_class = await self.runtime_class(rec.runtime_class)
            except RuntimeClassRefused as exc:
                log.info("sandbox %s cannot move from %s: %s", rec.key, node, exc)
                return RETRY_CLASS
        choice = self.choose(rec, runtime_class, leaving=node)
        if choice.node is None:
            if self.waiting.get(rec.key) != choice.message:
                log.info("sandbox %s cannot move from %s: %s", rec.key, node, choice.message)
            self.waiting[rec.key] = choice.message  # tried again when room is made
            return None
        self.waiting.pop(rec.key, None)
        if not self.is_leader():
            return None
        result = await asyncio.to_thread(
            self.api.bind, rec.namespace, rec.name, choice.node, str(rec.resource_version)
        )
        self.metrics.scheduling_attempts.labels(result=result.outcome).inc()
        if result.body is not None:
            self.cache.upsert(result.body)
        if result.outcome == "bound":
            log.info("sandbox %s moved from node %s to %s", rec.key, node, choice.node)
            return None
        return 0.0 if result.outcome != "gone" else None  # changed meanwhile: decide afresh

    async def _bind(self, rec: SandboxRecord, node: str, now: datetime) -> float | None:
        rv = str(rec.resource_version)
        for _ in range(MAX_BIND_ATTEMPTS):
            if not self.is_leader():
                return None
            result = await asyncio.to_thread(self.api.bind, rec.namespace, rec.name, node, rv)
            self.metrics.scheduling_attempts.labels(result=result.outcome).inc()
            if result.outcome == "gone":
                return None
            assert result.body is not None
            if result.outcome == "taken":
                self.cache.upsert(result.body)
                return None
            if result.outcome == "conflict":
                fresh = self.cache.upsert(result.body) or rec
                if not fresh.wants_node:
                    return None
                rv = result.body["metadata"]["resourceVersion"]
                continue
            self.cache.upsert(result.body)
            log.info("sandbox %s bound to node %s", rec.key, node)
            await self._mark_scheduled(result.body, node, now)
            return None
        return 0.0  # still conflicting: decide afresh

    async def _mark_scheduled(self, body: dict[str, Any], node: str, now: datetime) -> None:
        meta = body["metadata"]
        for _ in range(MAX_BIND_ATTEMPTS):
            if (body.get("status") or {}).get("phase", SandboxPhase.PENDING) != (
                SandboxPhase.PENDING
            ):
                return  # the agent (or a Dead marking) got there first
            if not self.is_leader():
                return
            status = {
                "phase": SandboxPhase.SCHEDULED,
                "conditions": with_scheduled(
                    body, "True", ScheduledReason.BOUND, f"bound to node {node}", now
                ),
            }
            written = await asyncio.to_thread(
                self.api.write_status,
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
                    self.api.get_sandbox, meta["namespace"], meta["name"]
                )
            except Exception:
                return  # gone; or the agent will still run it: Scheduled is a courtesy
        log.warning("sandbox %s/%s: phase Scheduled not written", meta["namespace"], meta["name"])

    async def _report_waiting(
        self, rec: SandboxRecord, reason: str, message: str, now: datetime
    ) -> float | None:
        if self.waiting.get(rec.key) == message:
            return None
        log.info("sandbox %s waits (%s): %s", rec.key, reason, message)
        # Read once for an exact merge of the other conditions (a rare write: only
        # when the reason changes).
        try:
            body = await asyncio.to_thread(self.api.get_sandbox, rec.namespace, rec.name)
        except Exception:
            return None  # gone (its DELETED event follows) or unreadable: the next event retries
        fresh = self.cache.upsert(body) or rec
        if not (fresh.wants_node or _prebound_pending(fresh)) or not self.is_leader():
            return None
        written = await asyncio.to_thread(
            self.api.write_status,
            rec.namespace,
            rec.name,
            {"conditions": with_scheduled(body, "False", reason, message, now)},
            body["metadata"]["resourceVersion"],
        )
        if written is None:
            self.waiting[rec.key] = ""  # changed meanwhile: judge the new version
            return 0.0
        self.waiting[rec.key] = message
        self.cache.upsert(written)
        return None


def _prebound_pending(rec: SandboxRecord) -> bool:
    """Created with spec.nodeName already set and not yet picked up by that node's agent."""
    return rec.node is not None and rec.phase == SandboxPhase.PENDING


def register(registry: kopf.OperatorRegistry, scheduler: Scheduler) -> None:
    forward_events(
        registry, (GROUP, VERSION, NODES), scheduler.on_node, name="scheduler_node_event"
    )
    forward_events(
        registry, ("", "v1", KUBE_NODES), scheduler.on_kube_node, name="scheduler_kube_node_event"
    )
