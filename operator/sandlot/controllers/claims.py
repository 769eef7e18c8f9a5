"""The SandboxClaim controller: binds each claim to a Running member of its pool.

Decisions are ``policy.claims.decide_claim`` over memory: the claims' last events,
the pools' (the pool controller's cache) and the sandbox cache. Binding is one
write to the chosen sandbox, guarded by the resourceVersion it was chosen at: its
``sandlot.dev/pool`` label is removed (it leaves the pool, whose controller starts
a replacement at once from the same cache event), ``sandlot.dev/claim`` and
``sandlot.dev/claimed-from`` are set, and the claim becomes its controlling owner
(Kubernetes' garbage collector deletes it with the claim; this controller also
deletes it on the claim's DELETED event, so a control plane without a collector
behaves the same). The claim's status follows. A lost race (409) re-decides with
the next member. A restart finds a sandbox already labelled for a claim and only
writes the status that was missing.

A claim's ``spec.lifecycle`` (``policy.claims.decide_claim_end``) is applied
before binding: at its ``shutdownTime`` the claim and its sandbox are deleted
(``Delete``) or the sandbox is stopped with reason ``ClaimExpired`` and the claim
becomes ``Expired`` (``Retain``); a ``Lost`` or ``Expired`` claim goes with its
sandbox at ``finishedAt`` + TTL. The queue wakes the claim at that second.

Claims waiting for a member are woken by their pool's member events; nothing
polls. Only the leader writes. A claim is what a user waits on, so its two writes
(take, status) go first: they are one job on threads of their own (on the shared
default executor they would queue behind other controllers' writes, and between
two jobs the status would wait for the event loop), and the pool's reaction to the
member leaving (its replacement) is held until the status is written, at most
``POOL_HOLD_LIMIT``, instead of competing with it for the API server and this
process. The replacement starts a few milliseconds later; nothing waits on it.

Up to ``CLAIM_WORKERS`` claims are bound at once. A member being taken is kept
from every other claim's decision until its take is answered (``_taking``): the
decision and the mark happen with no await between them on the one event loop,
so concurrent claims choose different members instead of racing for the same
one and losing all but one take to its resourceVersion precondition. Each pool's
claimable members are kept oldest first (``controllers.offered``), so choosing
one costs no scan of the pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sandlot.adapters.workloads import WorkloadApi
from sandlot.api.claim import FINAL_CLAIM_PHASES, ClaimPhase
from sandlot.api.common import API_VERSION, controller_reference, join_key
from sandlot.api.keys import (
    CLAIM_LABEL,
    CLAIMED_AT_ANNOTATION,
    CLAIMED_FROM_LABEL,
    CLAIMED_IDLE_ANNOTATION,
    POOL_LABEL,
)
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase, ShutdownPolicy
from sandlot.api.timestamps import parse_time, rfc3339, utcnow
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.offered import OfferedMembers
from sandlot.controllers.pools import PoolController
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord, record_of, tell_synced
from sandlot.controllers.workqueue import WorkQueue
from sandlot.policy.claims import (
    NO_LIFECYCLE,
    Candidate,
    ClaimAction,
    ClaimLifecycle,
    EndAction,
    bound_status,
    decide_claim,
    decide_claim_end,
    hold_replacements,
)
from sandlot.policy.marking import ended_status

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_AFTER_ERROR = 0.5
RETRY_CAP = 30.0
MAX_BIND_ATTEMPTS = 3
# Claims bound at once: each bind is two writes waiting on the API server, so one at
# a time leaves it idle between them. Every worker has a thread for its writes.
CLAIM_WORKERS = 16
CLAIM_THREADS = CLAIM_WORKERS
POOL_HOLD_LIMIT = 2.0  # seconds a binding claim may defer its pool's reaction, at most
BURST_HOLD_LIMIT = 10.0  # seconds a pool's unbound claims may defer its reaction, at most


@dataclass(frozen=True)
class ClaimState:
    namespace: str
    name: str
    uid: str
    pool_name: str
    status: Mapping[str, Any]
    lifecycle: ClaimLifecycle = NO_LIFECYCLE

    @property
    def key(self) -> str:
        return join_key(self.namespace, self.name)

    @property
    def pool_key(self) -> str:
        return join_key(self.namespace, self.pool_name)

    def owner_reference(self) -> dict[str, Any]:
        return controller_reference(
            API_VERSION, "SandboxClaim", self.name, self.uid, block_owner_deletion=False
        )


def claim_state(body: Mapping[str, Any]) -> ClaimState:
    meta = body["metadata"]
    spec = body.get("spec") or {}
    return ClaimState(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        pool_name=spec.get("poolName", ""),
        status=dict(body.get("status") or {}),
        lifecycle=_lifecycle(spec.get("lifecycle")),
    )


def _lifecycle(spec: Mapping[str, Any] | None) -> ClaimLifecycle:
    if not spec:
        return NO_LIFECYCLE
    ttl = spec.get("ttlSecondsAfterFinished")
    return ClaimLifecycle(
        shutdown_time=parse_time(spec.get("shutdownTime")),
        delete=spec.get("shutdownPolicy") == ShutdownPolicy.DELETE,
        ttl_seconds=int(ttl) if ttl is not None else None,
    )


def _candidate(rec: SandboxRecord) -> Candidate:
    return Candidate(rec.name, rec.phase, rec.created_at, rec.ip, rec.node, rec.paused, rec.ready)


class ClaimController:
    def __init__(
        self,
        api: WorkloadApi,
        cache: SandboxCache,
        pools: PoolController,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = utcnow,
        queue_clock: Callable[[], float] = time.monotonic,
        metrics: WorkloadMetrics | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.pools = pools
        self.is_leader = is_leader
        self.clock = clock
        self.claims: dict[str, ClaimState] = {}
        self.synced = False  # the informer's first complete list is in
        self.on_synced: list[Callable[[], None]] = []
        self._waiting: dict[str, set[str]] = {}  # pool key -> claims without a sandbox
        self._released: dict[str, SandboxRecord] = {}  # deleted claim -> its sandbox
        self._first_seen: dict[str, float] = {}  # unbound claim -> when first seen (queue clock)
        self._taking: set[str] = set()  # members a claim is taking right now
        self._unbound: dict[str, set[str]] = {}  # pool key -> its claims not bound yet
        self._burst: dict[str, int] = {}  # pool key -> the hold its unbound claims keep
        self.metrics = metrics
        self._threads = ThreadPoolExecutor(CLAIM_THREADS, thread_name_prefix="claims")
        self.queue = WorkQueue(
            "claim",
            self.reconcile,
            is_leader=is_leader,
            clock=queue_clock,
            backoff_start=RETRY_AFTER_ERROR,
            backoff_cap=RETRY_CAP,
        )
        self.offered = OfferedMembers(cache)
        cache.listeners.append(self.on_sandbox)

    # -- inputs ---------------------------------------------------------------------

    def on_event(self, event_type: str, body: Mapping[str, Any]) -> None:
        """The claim informer's event (``eventfeed``), on the loop."""
        self.on_claim(None if event_type == "SYNC" else event_type, body)

    def retain(self, keys: set[str]) -> None:
        """A complete list held exactly ``keys``: every other claim was deleted while
        no watch was there to say so."""
        for key in [k for k in self.claims if k not in keys]:
            self._deleted(self.claims[key])
        if not self.synced:
            self.synced = True
            tell_synced(self.on_synced, "claim")

    def on_claim(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        state = claim_state(body)
        if event_type == "DELETED":
            self._deleted(state)
            return
        self.claims[state.key] = state
        unbound = not state.status.get("sandboxName")
        if unbound:
            self._first_seen.setdefault(state.key, self.queue.clock())
        self._note_unbound(state, unbound and state.status.get("phase") not in FINAL_CLAIM_PHASES)
        self.queue.add(state.key)

    def _note_unbound(self, claim: ClaimState, unbound: bool) -> None:
        claims = self._unbound.setdefault(claim.pool_key, set())
        if unbound:
            claims.add(claim.key)
        else:
            claims.discard(claim.key)
        self._settle_burst(claim.pool_key)

    def _settle_burst(self, pool_key: str) -> None:
        """Hold the pool's reaction while its unbound claims all have members to take
        (``hold_replacements``), ``BURST_HOLD_LIMIT`` at most: a hold past its limit
        is not taken again until the pool's claims have all been bound once."""
        unbound = self._unbound.get(pool_key) or set()
        hold = self._burst.get(pool_key)
        if hold_replacements(len(unbound), len(self._waiting.get(pool_key) or ())):
            if hold is None:
                self._burst[pool_key] = self.pools.queue.hold(pool_key, BURST_HOLD_LIMIT)
            return
        if hold is not None:
            del self._burst[pool_key]
            self.pools.queue.release(pool_key, hold)
        if not unbound:
            self._unbound.pop(pool_key, None)

    def _deleted(self, state: ClaimState) -> None:
        self.claims.pop(state.key, None)
        self._first_seen.pop(state.key, None)
        self._waiting.get(state.pool_key, set()).discard(state.key)
        self._note_unbound(state, False)
        bound = self.bound(state)
        if bound is not None:
            self._released[state.key] = bound
            self.queue.add(state.key)
        else:
            self.queue.forget(state.key)

    async def _delete(self, rec: SandboxRecord) -> None:
        """The claim is gone: so is its sandbox (uid precondition)."""
        await self._call(self.api.delete_sandbox, rec.namespace, rec.name, rec.uid)
        self.cache.forget(rec.key, rec.uid)
        log.info("claim %s deleted: deleted its sandbox %s", rec.claim, rec.key)

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        for rec in (old, new):
            if rec is None:
                continue
            if rec.claim is not None:
                key = join_key(rec.namespace, rec.claim)
                if key in self.claims:
                    self.queue.add(key)
            elif rec.ready and rec.pool_key in self._waiting:
                self.queue.add_all(list(self._waiting[rec.pool_key]))

    def enqueue_all(self) -> None:
        self.queue.add_all(list(self.claims))

    async def run(self) -> None:
        await self.queue.run(workers=CLAIM_WORKERS)

    # -- the worker -----------------------------------------------------------------

    def bound(self, claim: ClaimState) -> SandboxRecord | None:
        name = claim.status.get("sandboxName")
        rec = self.cache.get(join_key(claim.namespace, name)) if name else None
        if rec is not None and rec.claim == claim.name and rec.owner_uid == claim.uid:
            return rec
        for rec in self.cache.claimed(claim.namespace, claim.name):
            if rec.owner_uid == claim.uid:
                return rec
        return None

    def offer(
        self, claim: ClaimState, bound: SandboxRecord | None
    ) -> tuple[bool, list[SandboxRecord]]:
        """Whether the claim's pool exists, and the member it would take (when it has
        none yet): the oldest claimable one no other claim is taking."""
        pool = self.pools.pools.get(claim.pool_key)
        if pool is None or pool.deleting:
            return False, []
        if bound is not None:
            return True, []
        first = self.offered.first(claim.pool_key, pool.uid, self._taking)
        return True, [first] if first is not None else []

    async def reconcile(self, key: str) -> float | None:
        released = self._released.pop(key, None)
        if released is not None:
            await self._delete(released)
        claim = self.claims.get(key)
        if claim is None:
            return None
        if await self._end(claim):
            return None
        for _ in range(MAX_BIND_ATTEMPTS):
            bound = self.bound(claim)
            exists, members = self.offer(claim, bound)
            decision = decide_claim(
                claim.status,
                _candidate(bound) if bound is not None else None,
                exists,
                [_candidate(m) for m in members],
                claim.pool_name,
            )
            waiting = self._waiting.setdefault(claim.pool_key, set())
            waiting.discard(key)
            if decision.action is ClaimAction.NONE:
                if bound is None and claim.status.get("phase") in (None, ClaimPhase.PENDING):
                    waiting.add(key)
                    self._settle_burst(claim.pool_key)  # starved: the pool grows now
                return None
            if not self.is_leader():
                return None
            if decision.action is ClaimAction.STATUS:
                if decision.status.get("phase") == ClaimPhase.PENDING:
                    waiting.add(key)
                    self._settle_burst(claim.pool_key)
                status = dict(decision.status)
                if status.get("phase") in FINAL_CLAIM_PHASES and not claim.status.get("finishedAt"):
                    status["finishedAt"] = rfc3339(self.clock())  # its TTL counts from here
                await self._write_status(claim, status)
                return None
            chosen = {m.name: m for m in members}[decision.sandbox or ""]
            self._taking.add(chosen.key)  # before any await: no other claim picks it
            try:
                if await self._bind(claim, chosen):
                    return None
            finally:
                self._taking.discard(chosen.key)
        return RETRY_AFTER_ERROR  # lost every race: try again soon

    async def _end(self, claim: ClaimState) -> bool:
        """Apply the claim's lifecycle now; True when that is all there is to do."""
        now = self.clock()
        finished = parse_time(claim.status.get("finishedAt"))
        end = decide_claim_end(claim.status.get("phase"), claim.lifecycle, finished, now)
        if end.action is EndAction.NONE:
            if end.wait_seconds is not None:
                self.queue.add_after(claim.key, end.wait_seconds)
            return False
        if not self.is_leader():
            return True
        if end.action is EndAction.STAMP:
            await self._write_status(claim, {"finishedAt": rfc3339(now)})
            return True
        bound = self.bound(claim)
        if end.action is EndAction.DELETE:
            if await self._call(self.api.delete_claim, claim.namespace, claim.name, claim.uid):
                log.info("claim %s: %s; deleted", claim.key, end.message)
            if bound is not None:
                await self._delete(bound)
            return True
        if bound is not None and not bound.terminal:
            reason = SandboxReason.CLAIM_EXPIRED
            stopped = ended_status(SandboxPhase.STOPPED, reason, end.message, now)
            written = await self._call(
                self.api.write_status, bound.namespace, bound.name, stopped, bound.resource_version
            )
            if written is None:  # changed meanwhile: decide again on what it is now
                self.queue.add_after(claim.key, RETRY_AFTER_ERROR)
                return True
            self.cache.upsert(written)
        expired = {
            "phase": ClaimPhase.EXPIRED.value,
            "message": end.message,
            "finishedAt": rfc3339(now),
        }
        await self._write_status(claim, expired)
        log.info("claim %s: %s; Expired", claim.key, end.message)
        return True

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def _bind(self, claim: ClaimState, rec: SandboxRecord) -> bool:
        """Take ``rec`` for ``claim``, then write the claim's status, as one job on the
        claim threads: the status is sent the moment the take is answered, instead of
        after a round through the event loop, which at that moment is busy with the
        events the take itself sets off (the member leaving, its replacement). False
        when the member was taken, changed or deleted meanwhile (the next one, then)."""
        bound_at = rfc3339(self.clock())
        annotations = {CLAIMED_AT_ANNOTATION: bound_at}
        if rec.idle_mark is not None:
            # The idle episode it is taken in: its agent wakes it for this claim by that
            # mark, never by comparing its own clock with ours.
            annotations[CLAIMED_IDLE_ANNOTATION] = rec.idle_mark
        metadata = {
            "labels": {
                POOL_LABEL: None,
                CLAIM_LABEL: claim.name,
                CLAIMED_FROM_LABEL: claim.pool_name,
            },
            "annotations": annotations,
            "ownerReferences": [claim.owner_reference()],
        }
        taken: dict[str, Any] | None = None

        def bind() -> dict[str, Any] | None:
            nonlocal taken
            taken = self.api.take_sandbox(
                rec.namespace, rec.name, str(rec.resource_version), metadata
            )
            if taken is None:
                return None
            status = {
                **bound_status(_candidate(record_of(taken))),
                "boundAt": bound_at,
                "message": None,
            }
            return self.api.patch_claim_status(claim.namespace, claim.name, status)

        try:
            # The member leaving sets off its pool's replacement (a create, a bind, the
            # pool's status, the container's start): the pool waits for the claim's
            # status instead of competing with it for the API server and this process.
            with self.pools.queue.held(claim.pool_key, POOL_HOLD_LIMIT):
                written = await self._call(bind)
        finally:
            if taken is not None:  # even when the status write failed: it is taken
                self.cache.upsert(taken)
        if taken is None:
            return False
        log.info("claim %s: bound to %s", claim.key, rec.name)
        self._note_unbound(claim, False)
        seen = self._first_seen.pop(claim.key, None)
        if seen is not None and self.metrics is not None:
            self.metrics.claim_wait_seconds.observe(self.queue.clock() - seen)
        self._remember(claim, written)
        if claim.key not in self.claims:  # deleted while it was being bound
            self._released[claim.key] = record_of(taken)
            self.queue.add(claim.key)
        return True

    async def _write_status(self, claim: ClaimState, status: dict[str, Any]) -> None:
        written = await self._call(self.api.patch_claim_status, claim.namespace, claim.name, status)
        self._remember(claim, written)

    def _remember(self, claim: ClaimState, written: Mapping[str, Any] | None) -> None:
        """The claim as the API server answered, unless a newer event arrived meanwhile."""
        if written is not None and self.claims.get(claim.key) is claim:
            self.claims[claim.key] = claim_state(written)
