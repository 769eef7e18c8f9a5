"""The node-health controller: from lease-based READY to marking a lost node's
sandboxes Dead, after a grace period that protects the agent-restart path.

Decisions come from ``sandlot.policy.nodehealth`` (pure); ``reconcile`` feeds it
from memory and does what it says. Nodes come from kopf's SandboxNode events and
Leases from a namespaced watch, so a pass costs no read at all; a handled dead
node costs nothing (the policy returns no patch and no marking). Work runs
through the shared ``WorkQueue`` keyed by node name, fed by kopf's resync timer,
by every change, and by the deadline each pass returns (lease expiry or grace
end), which the queue keeps exactly: a mark lands at its deadline, not on a tick.
A partial marking is retried ``RETRY_AFTER_FAILURE`` seconds later; the queue
keeps the earliest deadline, so a later one never pushes that retry back.

Decisions run on the liveness view's steady (monotonic) clock; the wall clock is
only what status, conditions and events say (``LivenessView.to_status``).

Only the elected leader acts (standbys keep their caches warm and drop work),
and it checks again before every write: a pass that loses the Lease stops.

A resourceVersion is opaque: the node cache compares them only for equality.
After our own status write the cache holds the answer, and watch events of
that node are ignored until the one carrying the answer's resourceVersion
arrives (a watch delivers one object's events in order, so those in between are
older); a listing (kopf's event type None) is always taken.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sandlot.adapters.objects import LeaseRecord, Objects
from sandlot.api.node import NodeHealthTracking, NodePhase
from sandlot.api.reasons import EventReason, SandboxReason
from sandlot.api.timestamps import utcnow
from sandlot.controllers.guardhold import HoldReporter
from sandlot.controllers.liveness import LivenessView, steady_clock
from sandlot.controllers.marking import Marker, NodeMarking, NotLeader
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.noderead import NodeRead, node_tracking
from sandlot.controllers.settings import OperatorSettings
from sandlot.controllers.workqueue import WorkQueue, earliest
from sandlot.policy.conditions import parse_conditions
from sandlot.policy.disruption import FleetMember, FleetSummary, summarize_fleet
from sandlot.policy.nodehealth import (
    LATCHING_KINDS,
    Decision,
    DecisionKind,
    NodeView,
    StatusPatch,
    decide,
    decide_deleted,
    ready_conditions,
    ready_until,
)

log = logging.getLogger(__name__)

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]  # body, type, reason, message

RETRY_AFTER_FAILURE = 2.0
FLEET_REUSE = 1.0  # seconds a summary is reused by a pass that would mark or hold
FLEET_REUSE_ROUTINE = 10.0  # seconds it is reused by any other pass (nothing to guard)
# The kinds the guard decides between: a pass ending in one of them would mark, or
# holds back from marking. Routine passes (the rest, while no guard holds) decide the
# same on any summary: the guard only ever changes these.
GUARDED_KINDS = frozenset({DecisionKind.REAP, DecisionKind.DRAIN_ABANDONED, DecisionKind.HOLD})


def _resource_version(body: Mapping[str, Any]) -> str | None:
    rv = (body.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv is not None else None


class NodeHealthController:
    def __init__(
        self,
        settings: OperatorSettings,
        objects: Objects,
        metrics: OperatorMetrics,
        *,
        is_leader: Callable[[], bool],
        post_event: EventPoster,
        clock: Callable[[], datetime] = utcnow,
        queue_clock: Callable[[], float] = time.monotonic,
        liveness: LivenessView | None = None,
    ) -> None:
        self.settings = settings
        self.objects = objects
        self.metrics = metrics
        self.is_leader = is_leader
        self.post_event = post_event
        self.wall = clock  # for what is written and read by people; never for a decision
        self.policy = settings.node_health
        self.guard = settings.guard
        # Liveness (observed renewals, on its steady clock) is shared with the scheduler.
        self.liveness = liveness or LivenessView(
            steady_clock(clock, queue_clock),
            unseen_duration=settings.node_health.unseen_lease_duration,
            staleness_bound=settings.lease_view_max_age,
            wall=clock,
        )
        self.clock = self.liveness.clock
        self.marker = Marker(
            objects, metrics, concurrency=settings.mark_concurrency, is_leader=is_leader
        )
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.tracking: dict[str, NodeHealthTracking] = {}
        self.reads: dict[str, NodeRead] = {}
        # node -> the stored status (its NodeRead) its last full pass found READY with
        # nothing to write: until its lease ends, a wake-up needs no full pass (see
        # ``policy.nodehealth.ready_until``). A new body is a new NodeRead.
        self._steady: dict[str, NodeRead] = {}
        self.queue = WorkQueue(
            "node",
            self.reconcile,
            is_leader=is_leader,
            clock=queue_clock,
            backoff_start=RETRY_AFTER_FAILURE,
            observe=metrics.reconcile_seconds.observe,
        )
        self.liveness.subscribe(lambda name: self.queue.call_threadsafe(self._revived, name))
        self._echo: dict[str, str] = {}  # node -> resourceVersion of our write, until seen
        self._writing: dict[str, set[str]] = {}  # node -> versions delivered during a write
        self.holds = HoldReporter(
            metrics,
            self.guard,
            self._post,
            clock=self.clock,
            wall_time=self.liveness.wall_time,
            is_leader=is_leader,
            on_lifted=self.enqueue_all,
        )
        self._fleet: tuple[datetime, FleetSummary] | None = None

    # -- inputs (called from kopf handlers and the lease watch) ----------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.queue.bind_loop(loop)

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A SandboxNode watch event (``event_type`` None: from a listing)."""
        name = body["metadata"]["name"]
        if event_type == "DELETED":
            self.nodes.pop(name, None)
            self.tracking.pop(name, None)
            self.reads.pop(name, None)
            self._steady.pop(name, None)
            self.liveness.forget(name)
            self._echo.pop(name, None)
            self.holds.forget(name)
            self._fleet = None
            self.queue.forget(name)
            return
        rv = _resource_version(body)
        if name in self._writing and rv is not None:
            self._writing[name].add(rv)
        awaited = self._echo.get(name)
        if awaited is not None and event_type is not None:
            if rv == awaited:  # our own write coming back: nothing new to decide
                del self._echo[name]
                self._keep(name, body)
            return  # otherwise delivered before it: older than what we hold
        else:
            self._echo.pop(name, None)  # a listing is current
        self._keep(name, body)
        self.queue.add(name)

    def _keep(self, name: str, body: Mapping[str, Any]) -> None:
        self.nodes[name] = body
        self.tracking[name] = self.liveness.from_status(name, node_tracking(body))
        self.reads[name] = NodeRead.of(body)

    def on_lease(self, event_type: str, lease: LeaseRecord) -> None:
        """A Lease watch event (watch thread). Only a renewal that revives a node
        enqueues it; a live node's routine renewal only moves its next deadline,
        which its pass at the old one finds."""
        self.liveness.on_lease_record(event_type, lease)

    def _revived(self, name: str) -> None:
        if name in self.nodes:
            self.queue.add(name)

    def on_heard(self) -> None:
        """The lease watch proved alive without news (watch thread)."""
        self.liveness.heard()

    def on_view_lost(self) -> None:
        """The lease watch failed (watch thread): no reaping until it is restored."""
        self.liveness.lost()

    def on_view_restored(self) -> None:
        """The lease watch listed afresh after a start or a failure (watch thread)."""
        self.liveness.restored()
        self.queue.call_threadsafe(self._restored)

    def _restored(self) -> None:
        self._fleet = None
        log.info("lease view (re)established; reaping waits one lease duration for renewals")
        self.enqueue_all()

    def enqueue(self, name: str) -> None:
        """A full pass over ``name`` (the resync timer's): nothing is taken as steady."""
        self._steady.pop(name, None)
        self.queue.add(name)

    def enqueue_all(self) -> None:
        self._steady.clear()
        self.queue.add_all(list(self.nodes))

    async def run(self) -> None:
        # Up to mark_concurrency nodes' passes at once: nodes lost together are
        # decided together, their writes bounded by the marker's shared pool.
        await self.queue.run(workers=self.settings.mark_concurrency)

    def fleet(self, now: datetime, reuse: float = FLEET_REUSE) -> FleetSummary:
        """Every node's observed phase at ``now``, summarized for the guard.

        A summary up to ``reuse`` seconds old is reused: a pass over N nodes would
        otherwise cost O(N) each, O(N^2) per resync of the fleet. An older summary
        cannot move a node's own deadline, only the guard's view of the others.
        """
        if self._fleet is not None and abs((now - self._fleet[0]).total_seconds()) < reuse:
            return self._fleet[1]
        members = []
        counts = dict.fromkeys(NodePhase, 0)
        for name, read in self.reads.items():
            tracking = self.tracking[name]
            phase = self.liveness.phase(name, read.unschedulable, tracking, now)
            counts[phase] += 1
            members.append(FleetMember(phase, tracking.handled_at))
        for phase, n in counts.items():
            self.metrics.nodes.labels(phase=str(phase)).set(n)
        summary = summarize_fleet(members, now, self.guard.window)
        self._fleet = (now, summary)
        return summary

    # -- the reconcile ----------------------------------------------------------------

    async def reconcile(self, name: str) -> float | None:
        """One pass over node ``name``; returns the seconds until it is due again."""
        body = self.nodes.get(name)
        if body is None or not self.liveness.established:
            return None  # before the first lease list every node would look NotReady
        now, stamp = self.clock(), self.wall()
        tracking = self.tracking[name]
        renewal = self.liveness.renewal(name, tracking)
        read = self.reads[name]
        view = read.view(self.liveness.first_seen(name))
        if self._steady.get(name) is read and not self.holds.reported:
            until = ready_until(view, renewal, now, self.policy.unseen_lease_duration)
            if until is not None:
                return (until - now).total_seconds()  # the same CLEAR, nothing to write
        self._steady.pop(name, None)
        fleet = self.fleet(now, FLEET_REUSE_ROUTINE)
        decision = decide(view, renewal, tracking, now, fleet, self.guard, self.policy, stamp=stamp)
        if decision.kind in GUARDED_KINDS or decision.guard_active or self.holds.reported:
            # The guard decides this pass, or may be lifting: judge it on a summary at
            # most FLEET_REUSE old (every pass does while the guard holds).
            fresh = self.fleet(now)
            if fresh is not fleet:
                decision = decide(
                    view, renewal, tracking, now, fresh, self.guard, self.policy, stamp=stamp
                )
        self.holds.report(name, decision, body, now)
        blocked = self.liveness.reap_blocked_until(name, now)
        if decision.kind in LATCHING_KINDS and blocked:
            # The view of the Leases is too young (just re-listed after a start or an
            # outage: agents renew as soon as they reach the API server again, give them
            # one lease duration) or too old (a watch that died silently) to reap from.
            log.info("node %s: grace over, but the lease view allows no reaping before %s",
                     name, self.liveness.wall_time(blocked))  # fmt: skip
            if decision.patch is not None and not await self._write(
                name, self._wire(name, decision.patch)
            ):
                return None
            return max((blocked - now).total_seconds(), 0.0)

        patch = self._wire(name, decision.patch) if decision.patch is not None else None
        retry: float | None = None
        if decision.marks_dead:
            try:
                latched = await self._mark(name, body, decision, now)
            except NotLeader as e:
                log.info("%s", e)
                return None
            if latched is None:
                retry = RETRY_AFTER_FAILURE  # the latch stays unset; mark the rest soon
            else:
                patch = latched
        patch = self._with_ready(patch, decision, view, stamp)
        patch = read.with_disk(patch, stamp)
        if patch is not None and not await self._write(name, patch):
            return None
        if decision.kind is DecisionKind.CLEAR and patch is None:
            self._steady[name] = read
        self._events(decision, body)
        return earliest(retry, self._next_wake(name, decision, tracking, now))

    def _wire(self, name: str, patch: StatusPatch) -> dict[str, Any]:
        """``patch`` as sent: its moments on the wall clock."""
        health = self.liveness.to_status(name, patch.health)
        return patch.model_copy(update={"health": health}).wire()

    async def _write(self, name: str, patch: dict[str, Any]) -> bool:
        """Write the node's status if still the leader; False when not."""
        if not self.is_leader():
            log.info("node %s: no longer the leader; status not written", name)
            return False
        self._writing[name] = set()
        before = _resource_version(self.nodes.get(name) or {})
        try:
            written = await asyncio.to_thread(self.objects.patch_node_status, name, patch)
        finally:
            delivered = self._writing.pop(name, set())
        rv = _resource_version(written)
        # A write that changed nothing answers with the version it was made on: no echo comes.
        if rv is not None and rv not in delivered and name in self.nodes and rv != before:
            self._keep(name, written)
            self._echo[name] = rv
        return True

    def _post(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        if self.is_leader():
            self.post_event(body, type_, reason, message)

    async def handle_deleted(self, name: str, body: Mapping[str, Any]) -> NodeMarking:
        """A SandboxNode was deleted: its non-terminal sandboxes become Dead (NodeDeleted)."""
        decision = decide_deleted(node_tracking(body))
        result = await self._mark_all(name, decision)
        if not result.complete:
            raise RuntimeError(
                f"{len(result.failed)} of node {name}'s sandboxes could not be marked Dead: "
                f"{sorted(result.failed.items())[:3]}"
            )
        return result

    # -- acting -------------------------------------------------------------------

    async def _mark_all(self, name: str, decision: Decision) -> NodeMarking:
        """Mark the node's live sandboxes Dead, stamped on the wall clock. A lost (not
        deleted) node that renews its lease meanwhile stops it: news the decision lacked."""
        reason = decision.reason or SandboxReason.NODE_LOST
        message = {
            DecisionKind.REAP: f"node {name} stopped renewing its lease and its grace period "
            f"({self.policy.grace_period.total_seconds():g}s) ended",
            DecisionKind.DRAIN_ABANDONED: f"node {name} was drained and its lease has been "
            f"expired for over {self.policy.drain_timeout.total_seconds():g}s",
            DecisionKind.DELETED: f"SandboxNode {name} was deleted",
            DecisionKind.MANUAL_REAP: f"an operator declared node {name} lost (sandlot nodes reap)",
        }.get(decision.kind, reason)
        came_back: Callable[[], bool] | None = None
        if decision.kind is not DecisionKind.DELETED:
            came_back = functools.partial(
                self._renewed, name, self.tracking.get(name, decision.tracking)
            )
        return await self.marker.mark_node(name, reason, message, self.wall(), came_back)

    def _renewed(self, name: str, tracking: NodeHealthTracking) -> bool:
        # Asked from the marker's write threads; the liveness view takes its lock.
        return self.liveness.expiry(name, tracking) > self.clock()

    async def _mark(
        self, name: str, body: Mapping[str, Any], decision: Decision, now: datetime
    ) -> dict[str, Any] | None:
        if decision.kind is DecisionKind.REAP:
            self.metrics.grace_expirations.inc()
            self._post(
                body,
                "Warning",
                EventReason.GRACE_EXPIRED,
                (
                    f"lease expired at {self._shown(decision.unhealthy_since)}; grace period over, "
                    "marking the node's sandboxes Dead"
                ),
            )
        elif decision.kind is DecisionKind.MANUAL_REAP:
            asked = ((body.get("spec") or {}).get("reap") or {}).get("requestedBy") or "someone"
            self._post(body, "Warning", EventReason.MANUAL_REAP, f"{asked} declared the node lost; "
                       "marking its sandboxes Dead, past any grace period or guard")  # fmt: skip
        result = await self._mark_all(name, decision)
        self._post(body, *result.outcome(name, decision.reason))
        if not result.complete:
            return None  # the latch stays unset
        latched = self._wire(name, decision.latched(now, len(result.marked)))
        latched["sandboxes"] = 0
        return latched

    def _with_ready(
        self, patch: dict[str, Any] | None, decision: Decision, view: NodeView, stamp: datetime
    ) -> dict[str, Any] | None:
        if decision.phase is None:
            return patch
        base = view.conditions
        if patch is not None and "conditions" in patch:
            base = parse_conditions(patch["conditions"])
        updated = ready_conditions(decision.phase, base, stamp)
        if updated is None:
            return patch
        patch = dict(patch or {"phase": str(decision.phase)})
        patch["conditions"] = [c.wire() for c in updated]
        return patch

    def _events(self, decision: Decision, body: Mapping[str, Any]) -> None:
        if decision.kind is DecisionKind.START_TRACKING:
            self._post(
                body,
                "Warning",
                EventReason.NODE_NOT_READY,
                (
                    f"lease expired at {self._shown(decision.unhealthy_since)}; sandboxes are "
                    f"marked Dead at {self._shown(decision.deadline)} unless the agent renews it"
                ),
            )
        elif decision.recovered:
            self._post(
                body, "Normal", EventReason.NODE_RECOVERED, "the agent renews its lease again"
            )

    def _shown(self, moment: datetime | None) -> datetime | None:
        return None if moment is None else self.liveness.wall_time(moment)

    # -- wake-ups -------------------------------------------------------------------

    def _next_wake(
        self, name: str, decision: Decision, tracking: NodeHealthTracking, now: datetime
    ) -> float | None:
        """Seconds until the node's next deadline; None leaves it to events and the resync."""
        wake = decision.wake_at
        if decision.phase is NodePhase.READY:
            # Notice NotReady at the moment it happens.
            wake = self.liveness.expiry(name, tracking)
        return None if wake is None else (wake - now).total_seconds()
