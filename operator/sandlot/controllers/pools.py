"""The SandboxPool controller: keeps ``spec.replicas`` live members, replaces the
ones that end (Dead, Stopped, Failed), routes traffic to the Running ones.

A reconcile of one pool, from memory (the pool's last event and the sandbox
cache), in this order:

1. routing (``sandlot.controllers.routing``): the EndpointSlices follow the
   members' phases first, so traffic leaves a lost member before anything else;
2. the plan (``sandlot.policy.pools.plan_pool``, pure): how many to create, which
   surplus to delete, which terminal members are past the history limit;
3. creates (generateName ``<pool>-``, labels from the template plus
   ``sandlot.dev/pool``, owned by the pool so Kubernetes' garbage collector
   deletes them with it) and deletes (uid and resourceVersion preconditions: a
   member a claim took after the plan is not deleted, the pass decides again),
   each answer put into the cache at once so the next pass does not do it again;
4. status through the subresource, only when it changed.

Members are the sandboxes labelled with the pool's name *and* controlled by its
uid: a stranger wearing the label is not adopted, and a pool re-created under
the same name does not inherit its predecessor's members.

Work goes through a ``WorkQueue`` keyed by pool, fed by pool events, member
events and a periodic resync; only the leader acts. A pass with failed writes is
due again ``RETRY_AFTER_ERROR`` seconds later; one that raises is retried with
the queue's per-key backoff.

The pool cache takes watch events as they come (a watch delivers one object's
events in order; the operator never writes a pool's spec, so no spec can go
back) and keeps its own status write's answer only while nothing newer has
arrived; resourceVersions are compared for equality only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import kopf

from sandlot.adapters.workloads import WorkloadApi
from sandlot.api.common import API_VERSION, GROUP, POOLS, VERSION, join_key
from sandlot.api.keys import POOL_LABEL
from sandlot.api.reasons import EventReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import rfc3339, utcnow
from sandlot.controllers.kopfhandlers import forward_events
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.routing import PoolRef, Router, ServiceTaken
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord
from sandlot.controllers.workqueue import WorkQueue, earliest
from sandlot.policy.pools import (
    Backoff,
    Member,
    PoolDecision,
    PoolPlan,
    Rollout,
    decide_pool,
    next_available,
    spec_hash,
)

log = logging.getLogger(__name__)

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]

RETRY_AFTER_ERROR = 2.0
RETRY_CAP = 60.0
WRITE_CONCURRENCY = 8
PASS_REST = 0.05
"""Seconds a pool rests after a pass before the next: a pass judges every member,
and in a burst of claims member events come faster than passes end. Back to back,
a 500-member pool's passes took most of the operator's CPU (py-spy, ``--gil``,
``bench/claims.py --burst``) from the claims' own binding; resting, a storm of
events costs at most 20 passes a second, and a replacement starts at most this
much later. Claims bind from members already warm, never waiting on a pass."""
BACKOFF = Backoff()


@dataclass(frozen=True)
class PoolState:
    """A pool's last seen object, trimmed to what the controller reads."""

    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    deleting: bool
    replicas: int
    history_limit: int
    service_name: str | None
    template: Mapping[str, Any]
    status: Mapping[str, Any]
    body_ref: Mapping[str, Any]  # apiVersion/kind/metadata for Events
    rollout: Rollout = field(default_factory=Rollout)
    template_hash: str = ""
    min_ready: timedelta = timedelta(0)

    @property
    def key(self) -> str:
        return join_key(self.namespace, self.name)

    @property
    def selector(self) -> str:
        return f"{POOL_LABEL}={self.name}"

    def routing(self) -> PoolRef:
        ports = tuple((self.template.get("spec") or {}).get("ports") or ())
        return PoolRef(self.namespace, self.name, self.uid, self.service_name, ports)


def pool_state(body: Mapping[str, Any]) -> PoolState:
    meta = body["metadata"]
    spec = body.get("spec") or {}
    return PoolState(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        replicas=int(spec.get("replicas", 1)),
        history_limit=int(spec.get("historyLimit", 10)),
        service_name=spec.get("serviceName") or None,
        template=dict(spec.get("template") or {}),
        status=dict(body.get("status") or {}),
        rollout=_rollout(spec),
        min_ready=timedelta(seconds=int(spec.get("minReadySeconds") or 0)),
        template_hash=spec_hash((spec.get("template") or {}).get("spec") or {}),
        body_ref={
            "apiVersion": body.get("apiVersion", API_VERSION),
            "kind": body.get("kind", "SandboxPool"),
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
        },
    )


def _rollout(spec: Mapping[str, Any]) -> Rollout:
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    defaults = Rollout()
    return Rollout(
        max_surge=rolling.get("maxSurge", defaults.max_surge),
        max_unavailable=rolling.get("maxUnavailable", defaults.max_unavailable),
    )


def member_body(pool: PoolState) -> dict[str, Any]:
    """A new member from the pool's template, owned by the pool."""
    template_meta = pool.template.get("metadata") or {}
    metadata: dict[str, Any] = {
        "generateName": f"{pool.name}-",
        "namespace": pool.namespace,
        "labels": {**(template_meta.get("labels") or {}), POOL_LABEL: pool.name},
        "ownerReferences": [pool.routing().owner_reference()],
    }
    if template_meta.get("annotations"):
        metadata["annotations"] = dict(template_meta["annotations"])
    return {
        "apiVersion": API_VERSION,
        "kind": "Sandbox",
        "metadata": metadata,
        "spec": dict(pool.template.get("spec") or {}),
    }


def _member(rec: SandboxRecord, template_hash: str, node_ready: Callable[[str], bool]) -> Member:
    return Member(
        name=rec.name,
        phase=rec.phase,
        bound=rec.node is not None,
        created_at=rec.created_at,
        finished_at=rec.finished_at,
        current=rec.spec_hash == template_hash,
        reason=rec.reason,
        exit_code=rec.exit_code,
        ready=rec.ready,
        ready_since=rec.ready_since,
        # A paused member serves nobody either: it does not count as available.
        node_ready=rec.node is not None
        and rec.phase == SandboxPhase.RUNNING
        and not rec.paused
        and node_ready(rec.node),
    )


def desired_status(
    pool: PoolState, decision: PoolDecision, *, capped_at: int | None = None
) -> dict[str, Any]:
    plan = decision.plan
    until = decision.backoff_until
    return {
        "replicas": pool.replicas,
        "cappedAt": capped_at,
        "running": plan.running,
        "pending": plan.pending,
        "dead": plan.terminal,
        "updatedReplicas": decision.updated,
        "readyReplicas": decision.ready,
        "failedInARow": decision.failures,
        "backoffUntil": rfc3339(until) if until is not None else None,
        "selector": pool.selector,
        "observedGeneration": pool.generation,
    }


class PoolController:
    def __init__(
        self,
        api: WorkloadApi,
        cache: SandboxCache,
        router: Router,
        metrics: WorkloadMetrics,
        *,
        is_leader: Callable[[], bool],
        post_event: EventPoster,
        resync_interval: timedelta = timedelta(seconds=30),
        queue_clock: Callable[[], float] = time.monotonic,
        clock: Callable[[], datetime] = utcnow,
        node_ready: Callable[[str], bool] = lambda _: True,
        max_replicas: int = 1000,
        pass_rest: float = PASS_REST,
    ) -> None:
        self.api = api
        self.max_replicas = max_replicas
        # Whether a node is READY now (the scheduler's view): a member on any other
        # node does not count as available in a rollout.
        self.node_ready = node_ready
        self.cache = cache
        self.router = router
        self.metrics = metrics
        self.is_leader = is_leader
        self.post_event = post_event
        self.clock = clock
        self.resync_interval = resync_interval.total_seconds()
        self.pools: dict[str, PoolState] = {}
        self.seen: set[str] = set()  # every pool handed over, deleted ones too
        self.queue = WorkQueue(
            "pool",
            self.reconcile,
            is_leader=is_leader,
            clock=queue_clock,
            backoff_start=RETRY_AFTER_ERROR,
            backoff_cap=RETRY_CAP,
            observe=metrics.pool_reconcile_seconds.observe,
            rest=pass_rest,
        )
        self._writes = asyncio.Semaphore(WRITE_CONCURRENCY)
        cache.listeners.append(self.on_sandbox)

    # -- inputs ---------------------------------------------------------------------

    def on_pool(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        state = pool_state(body)
        self.seen.add(state.key)
        if event_type == "DELETED":
            self.pools.pop(state.key, None)
            self.queue.forget(state.key)
            with contextlib.suppress(KeyError):
                self.metrics.pool_ready_members.remove(state.namespace, state.name)
            self.router.forget(state.key)  # the garbage collector removes what it owned
            return
        self.pools[state.key] = state
        self.enqueue(state.key)

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        for rec in (old, new):
            if rec is not None and rec.pool_key is not None and rec.pool_key in self.pools:
                self.enqueue(rec.pool_key)

    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def enqueue_all(self) -> None:
        self.queue.add_all(list(self.pools))

    def on_leadership(self) -> None:
        self.router.reset()
        self.enqueue_all()

    # -- the worker -----------------------------------------------------------------

    async def run(self) -> None:
        resync = asyncio.create_task(self._resync(), name="pool-resync")
        try:
            await self.queue.run()
        finally:
            resync.cancel()

    async def _resync(self) -> None:
        """A safety net: a pass over every pool costs no request when nothing changed."""
        while True:
            await asyncio.sleep(self.resync_interval)
            self.enqueue_all()

    def members(self, pool: PoolState) -> list[SandboxRecord]:
        return [m for m in self.cache.members(pool.key) if m.owner_uid == pool.uid]

    async def reconcile(self, key: str) -> float | None:
        """One pass over pool ``key``; seconds until it is due again (after failed writes)."""
        pool = self.pools.get(key)
        if pool is None:
            return None
        members = self.members(pool)
        await self._route(pool, members)
        if pool.deleting:
            return None
        now = self.clock()
        # One judgment per node a pass: a pool's members share a few nodes.
        node_ready = functools.cache(self.node_ready)
        judged = [_member(m, pool.template_hash, node_ready) for m in members]
        replicas = min(pool.replicas, self.max_replicas)
        decision = decide_pool(
            replicas,
            pool.history_limit,
            judged,
            rollout=pool.rollout,
            backoff=BACKOFF,
            now=now,
            min_ready=pool.min_ready,
        )
        self.metrics.pool_ready_members.labels(pool.namespace, pool.name).set(decision.ready)
        by_name = {m.name: m for m in members}
        failures = await self._write(pool, decision.plan, by_name)
        status = desired_status(
            pool, decision, capped_at=replicas if replicas < pool.replicas else None
        )
        self._note_backoff(pool, decision)
        self._note_cap(pool, status["cappedAt"])
        if any(pool.status.get(k) != v for k, v in status.items()) and self.is_leader():
            written = await asyncio.to_thread(
                self.api.patch_pool_status, pool.namespace, pool.name, status
            )
            current = self.pools.get(key)
            if written is not None and current is pool:
                self.pools[key] = pool_state(written)  # nothing newer arrived meanwhile
        backoff_left = (
            (decision.backoff_until - now).total_seconds()
            if decision.backoff_until is not None
            else None
        )
        # A rollout waiting for members to count as available looks again the moment
        # the first of them does.
        ready_at = next_available(judged, now, pool.min_ready) if pool.min_ready else None
        ready_left = (ready_at - now).total_seconds() if ready_at is not None else None
        return earliest(RETRY_AFTER_ERROR if failures else None, backoff_left, ready_left)

    def _note_cap(self, pool: PoolState, capped_at: int | None) -> None:
        """One Event when a pool starts asking more than the operator keeps."""
        if capped_at is None or pool.status.get("cappedAt") == capped_at:
            return
        message = (
            f"spec.replicas {pool.replicas} is over the operator's limit of {capped_at} "
            "(pool_max_replicas): keeping that many"
        )
        log.warning("pool %s: %s", pool.key, message)
        self.post_event(pool.body_ref, "Warning", EventReason.REPLICAS_CAPPED, message)

    def _note_backoff(self, pool: PoolState, decision: PoolDecision) -> None:
        """One Event per new failure while backing off (the status says it too)."""
        if decision.backoff_until is None:
            return
        if pool.status.get("failedInARow") == decision.failures:
            return
        message = (
            f"{decision.failures} members failed in a row; replacements back off until "
            f"{rfc3339(decision.backoff_until)}"
        )
        log.warning("pool %s: %s", pool.key, message)
        self.post_event(pool.body_ref, "Warning", EventReason.BACK_OFF, message)

    async def _route(self, pool: PoolState, members: list[SandboxRecord]) -> None:
        try:
            await asyncio.to_thread(self.router.sync, pool.routing(), members)
        except ServiceTaken as e:
            log.warning("pool %s: %s", pool.key, e)
            self.post_event(pool.body_ref, "Warning", EventReason.SERVICE_TAKEN, str(e))

    async def _write(
        self, pool: PoolState, plan: PoolPlan, by_name: Mapping[str, SandboxRecord]
    ) -> int:
        """Create and delete what the plan says; returns how many calls failed."""

        async def create() -> bool:
            async with self._writes:
                if not self.is_leader():
                    return False
                try:
                    body = await asyncio.to_thread(
                        self.api.create_sandbox, pool.namespace, member_body(pool)
                    )
                except Exception as e:
                    log.warning("pool %s: cannot create a member: %s", pool.key, e)
                    return False
            self.metrics.pool_members_created.inc()
            self.cache.upsert(body)
            return True

        async def delete(rec: SandboxRecord, reason: str) -> bool:
            async with self._writes:
                if not self.is_leader():
                    return False
                try:
                    deleted = await asyncio.to_thread(
                        self.api.delete_sandbox,
                        rec.namespace,
                        rec.name,
                        rec.uid,
                        str(rec.resource_version),
                    )
                except Exception as e:
                    log.warning("pool %s: cannot delete %s: %s", pool.key, rec.name, e)
                    return False
            if not deleted:  # changed since the plan (a claim took it?) or gone: decide again
                log.info("pool %s: %s changed or went before its delete", pool.key, rec.name)
                return False
            self.metrics.pool_members_deleted.labels(reason=reason).inc()
            self.cache.forget(rec.key, rec.uid)
            return True

        jobs = [create() for _ in range(plan.create)]
        jobs += [
            delete(
                by_name[n], "surplus" if by_name[n].spec_hash == pool.template_hash else "rollout"
            )
            for n in plan.delete
        ]
        jobs += [delete(by_name[n], "history") for n in plan.collect]
        if not jobs:
            return 0
        if plan.create:
            replaced = sum(1 for m in by_name.values() if m.terminal)
            log.info(
                "pool %s: creating %d members (%d ended members kept)",
                pool.key,
                plan.create,
                replaced,
            )
        if plan.delete:
            log.info("pool %s: deleting surplus %s", pool.key, ", ".join(plan.delete))
        results = await asyncio.gather(*jobs)
        return sum(1 for ok in results if not ok)


def register(registry: kopf.OperatorRegistry, pools: PoolController) -> None:
    forward_events(registry, (GROUP, VERSION, POOLS), pools.on_pool, name="pool_event")
