"""The operator's in-memory view of every Sandbox, kept small.

The scheduler counts each node's non-terminal sandboxes (by pool), the pool
controller lists a pool's members and routing their IPs: all from here, so no
decision costs a request. At 10,000 sandboxes a full body (managedFields and all)
is a few KiB each; a ``SandboxRecord`` keeps only the dozen fields those
decisions read (the strings many records share, such as namespace, phase, node
and pool, once for all of them), and the per-node counts are kept up to date on
every change instead of being recounted.

Controllers that write or read a sandbox put the API server's answer here at once
(``upsert``, ``forget``), so the next decision already sees it. resourceVersions
are compared for equality only: until the watch delivers the answer's own version,
what it delivers is older and is dropped (``policy.freshness``, which bounds that
wait), and an answer whose version the watch already went past is dropped as
stale. A sandbox this operator deleted is remembered (by uid) until its DELETED
event, so a late MODIFIED event of it cannot bring it back.

Until the first complete list has been taken in (``synced``) the view is a part of
the fleet, and a part looks like a fleet that lost sandboxes: a pool short of
members, a Service without endpoints, a claim whose sandbox is gone, a node with
room. Whoever acts on it waits for ``synced`` (``on_synced`` says when).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sandlot.api.common import join_key, key_of
from sandlot.api.keys import CLAIM_LABEL, POOL_LABEL
from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode, SandboxPhase, ShutdownPolicy
from sandlot.api.timestamps import parse_time, utcnow
from sandlot.policy.freshness import Awaited, Judgement, judge_answer, judge_event
from sandlot.policy.idle import idle_mark
from sandlot.policy.lifetimes import NO_ENDING, Ending, deadline_of
from sandlot.policy.placement import Placement
from sandlot.policy.pools import ended_by_fault, spec_hash
from sandlot.policy.readiness import (
    observed_ready_since,
    ready_mark,
    recorded_ready,
    sandbox_ready,
)
from sandlot.policy.statemove import state_movable

log = logging.getLogger(__name__)

TOMBSTONE_TTL = 600.0
# How long the watch may lag behind a write before its events are believed again.
WATCH_LAG = 10.0
# The versions the watch delivered lately, per sandbox: the last few of the sandboxes
# that changed last. An answer about one of them that arrives after the watch went
# past it is recognised as stale; beyond this memory the WATCH_LAG bound still holds.
PASSED_VERSIONS = 4
PASSED_KEYS = 4096


@dataclass(slots=True)
class SandboxRecord:
    namespace: str
    name: str
    uid: str
    resource_version: str  # opaque: compared for equality only
    phase: str
    node: str | None
    pool: str | None  # the sandlot.dev/pool label
    owner_uid: str | None  # the controlling owner's uid
    ip: str | None
    created_at: datetime
    finished_at: datetime | None
    conditions: tuple[tuple[str, str, str], ...] = ()  # (type, status, reason)
    placement: Placement | None = None  # None: no tolerations, selector or affinity
    deadline: datetime | None = None  # where its lifetime ends (policy.lifetimes)
    ending: Ending = NO_ENDING  # shutdownPolicy and ttlSecondsAfterFinished (policy.lifetimes)
    spec_hash: str | None = None  # pool members only: compared with the template's
    claim: str | None = None  # the sandlot.dev/claim label: the SandboxClaim it is bound to
    reason: str | None = None
    exit_code: int | None = None
    paused: bool = False  # spec.operatingMode Paused or Suspended: serving nobody
    ready: bool = False  # Running, and its readiness probe passed (or it has none)
    ready_mark: str | None = None  # its Ready episode as its agent named it (equality only)
    # Since when this operator has seen it Ready, on its own clock (None: not ready);
    # the cache keeps it while the episode (``ready_mark``) lasts.
    ready_since: datetime | None = None
    runtime_class: str | None = None  # spec.runtimeClassName
    snapshot: str | None = None  # spec.snapshotRef.name: a fork, placed on its snapshot's node
    state_node: str | None = None  # status.suspendedState.node: its state was pushed from there
    idle_mark: str | None = None  # its idle pause or suspension (policy.idle.idle_mark)

    @property
    def movable(self) -> bool:
        """Suspended, its state pushed: any node may start it again (``policy.statemove``)."""
        return state_movable(self.phase, self.conditions, self.state_node)

    @property
    def key(self) -> str:
        return join_key(self.namespace, self.name)

    @property
    def pool_key(self) -> str | None:
        return join_key(self.namespace, self.pool) if self.pool else None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def holds_slot(self) -> bool:
        """Bound and not terminal: it counts against its node's capacity."""
        return self.node is not None and not self.terminal

    @property
    def wants_node(self) -> bool:
        return self.node is None and self.phase == SandboxPhase.PENDING


def _shared(value: str | None) -> str | None:
    """One string object per distinct value: every record's namespace, phase, node,
    pool and owner would otherwise be its own copy, parsed from its own event."""
    return sys.intern(value) if value else None


def _conditions(status: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    found = status.get("conditions")
    if not found:
        return ()
    return tuple(
        (
            sys.intern(str(c.get("type"))),
            sys.intern(str(c.get("status"))),
            sys.intern(str(c.get("reason") or "")),
        )
        for c in found
    )


def tell_synced(listeners: Iterable[Callable[[], None]], what: str) -> None:
    """Tell each of a cache's sync listeners that its first complete list is in; one
    that fails is logged and the others still hear it."""
    for callback in listeners:
        try:
            callback()
        except Exception:
            log.exception("%s sync listener failed", what)


def record_of(body: Mapping[str, Any]) -> SandboxRecord:
    meta = body["metadata"]
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    created_at = parse_time(meta.get("creationTimestamp")) or datetime.now(UTC)
    pool_label = (meta.get("labels") or {}).get(POOL_LABEL)
    phase = str(status.get("phase") or SandboxPhase.PENDING)
    probed = bool(spec.get("readinessProbe"))
    ready = sandbox_ready(phase, probed, recorded_ready(status))
    return SandboxRecord(
        namespace=sys.intern(meta["namespace"]),
        name=meta["name"],
        uid=meta.get("uid", ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        phase=sys.intern(phase),
        node=_shared(spec.get("nodeName")),
        pool=_shared(pool_label),
        owner_uid=_shared(owner.get("uid")) if owner else None,
        ip=status.get("ip"),
        created_at=created_at,
        finished_at=parse_time(status.get("finishedAt")),
        conditions=_conditions(status),
        placement=_placement(spec),
        deadline=_deadline(spec, created_at),
        ending=_ending(spec, status, phase, pool_label is not None),
        spec_hash=spec_hash(spec) if pool_label else None,
        claim=(meta.get("labels") or {}).get(CLAIM_LABEL),
        reason=_shared(status.get("reason")),
        exit_code=status.get("exitCode"),
        paused=spec.get("operatingMode", OperatingMode.RUNNING) != OperatingMode.RUNNING,
        ready=ready,
        ready_mark=ready_mark(status, probed) if ready else None,
        runtime_class=_shared(spec.get("runtimeClassName")),
        snapshot=(spec.get("snapshotRef") or {}).get("name"),
        state_node=_shared((status.get("suspendedState") or {}).get("node")),
        idle_mark=idle_mark(body),
    )


def _deadline(spec: Mapping[str, Any], created_at: datetime) -> datetime | None:
    seconds = spec.get("activeDeadlineSeconds")
    return deadline_of(
        parse_time(spec.get("shutdownTime")),
        int(seconds) if seconds is not None else None,
        created_at,
    )


def _ending(spec: Mapping[str, Any], status: Mapping[str, Any], phase: str, pooled: bool) -> Ending:
    ttl = spec.get("ttlSecondsAfterFinished")
    delete = spec.get("shutdownPolicy") == ShutdownPolicy.DELETE
    if ttl is None and not delete:
        return NO_ENDING
    kept = pooled and ended_by_fault(phase, status.get("reason"), status.get("exitCode"))
    return Ending(delete, int(ttl) if ttl is not None else None, kept)


def _placement(spec: Mapping[str, Any]) -> Placement | None:
    try:
        return Placement.from_body(spec)
    except ValueError:
        return None  # the API server validated it; a stale shape must not stop the cache


Listener = Callable[[SandboxRecord | None, SandboxRecord | None], None]  # (old, new)


class SandboxCache:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        watch_lag: float = WATCH_LAG,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self._clock = clock
        self._wall = wall  # the controllers' clock: when a member was first seen Ready
        self._watch_lag = watch_lag
        self._awaited: dict[str, Awaited] = {}  # key -> an answer the watch has not delivered
        self._passed: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # key -> versions
        self.records: dict[str, SandboxRecord] = {}
        self._by_pool: dict[str, set[str]] = {}
        self._by_claim: dict[str, set[str]] = {}  # "namespace/claim" -> sandbox keys
        self.node_load: Counter[str] = Counter()  # node -> non-terminal bound sandboxes
        self.node_pool_load: dict[str, Counter[str]] = {}  # node -> pool key -> count
        self._deleted: dict[str, float] = {}  # uid -> when this operator deleted it
        self.listeners: list[Listener] = []
        self.synced = False  # the first complete list is in; a re-list keeps it
        self.on_synced: list[Callable[[], None]] = []

    # -- reading ------------------------------------------------------------------

    def get(self, key: str) -> SandboxRecord | None:
        return self.records.get(key)

    def members(self, pool_key: str) -> list[SandboxRecord]:
        return [self.records[k] for k in self._by_pool.get(pool_key, ())]

    def claimed(self, namespace: str, claim: str) -> list[SandboxRecord]:
        """The sandboxes labelled as bound to SandboxClaim ``namespace/claim``."""
        return [self.records[k] for k in self._by_claim.get(join_key(namespace, claim), ())]

    def __iter__(self) -> Iterator[SandboxRecord]:
        return iter(list(self.records.values()))

    def __len__(self) -> int:
        return len(self.records)

    # -- feeding ------------------------------------------------------------------

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event, or SYNC for an object of a list."""
        if event_type == "DELETED":
            meta = body["metadata"]
            key = key_of(body)
            self._deleted.pop(meta.get("uid", ""), None)
            self._remove(key, meta.get("uid"))
            return
        new = record_of(body)
        if new.uid in self._deleted:
            return
        old = self.records.get(new.key)
        if old is None or old.uid != new.uid:  # another object: nothing held is about it
            self._awaited.pop(new.key, None)
            self._passed.pop(new.key, None)
            self._pass(new.key, new.resource_version)
            self._replace(old, new)
            return
        self._pass(new.key, new.resource_version)
        held = old.resource_version
        self._apply(
            old,
            new,
            judge_event(self._awaited.get(new.key), new.resource_version, held, self._clock()),
        )

    def retain(self, keys: set[str]) -> None:
        """A complete list held exactly ``keys``: drop every other record (deleted
        while the watch was away, so no DELETED event came), but not one this
        operator just wrote that the watch has yet to deliver (created after the
        list was taken)."""
        for key in [k for k in self.records if k not in keys and k not in self._awaited]:
            self._remove(key, None)
        if not self.synced:
            self.synced = True
            tell_synced(self.on_synced, "sandbox cache")

    def upsert(self, body: Mapping[str, Any]) -> SandboxRecord | None:
        """Take the API server's answer about a sandbox (a write's result or a read),
        unless the view already holds it or the watch went past it; returns the view."""
        new = record_of(body)
        if new.uid in self._deleted:
            return None
        old = self.records.get(new.key)
        if old is None or old.uid != new.uid:
            self._passed.pop(new.key, None)
            self._replace(old, new)
            self._awaited[new.key] = Awaited(new.resource_version, self._clock() + self._watch_lag)
            return new
        judgement = judge_answer(
            old.resource_version,
            self._passed.get(new.key, ()),
            new.resource_version,
            self._awaited.get(new.key),
            self._clock(),
            watch_lag=self._watch_lag,
        )
        return self._apply(old, new, judgement)

    def _apply(self, old: SandboxRecord, new: SandboxRecord, judgement: Judgement) -> SandboxRecord:
        if judgement.awaited is None:
            self._awaited.pop(new.key, None)
        else:
            self._awaited[new.key] = judgement.awaited
        if not judgement.take:
            return old
        self._replace(old, new)
        return new

    def _replace(self, old: SandboxRecord | None, new: SandboxRecord) -> None:
        same = old is not None and old.uid == new.uid
        previous = (old.ready_since, old.ready_mark) if old is not None and same else None
        new.ready_since = observed_ready_since(new.ready, new.ready_mark, previous, self._wall())
        if old is not None:
            self._unindex(old)
        self.records[new.key] = new
        self._index(new)
        self._notify(old, new)

    def _pass(self, key: str, version: str) -> None:
        """Remember that the watch delivered ``version`` of ``key``."""
        seen = self._passed.pop(key, ())
        self._passed[key] = (*seen, version)[-PASSED_VERSIONS:]
        if len(self._passed) > PASSED_KEYS:
            self._passed.popitem(last=False)

    def forget(self, key: str, uid: str) -> None:
        """This operator deleted ``key``: drop it now and ignore its late events."""
        now = time.monotonic()
        self._deleted[uid] = now
        if len(self._deleted) > 1024:
            for stale in [u for u, t in self._deleted.items() if now - t > TOMBSTONE_TTL]:
                del self._deleted[stale]
        self._remove(key, uid)

    def _remove(self, key: str, uid: str | None) -> None:
        old = self.records.get(key)
        if old is None or (uid and old.uid != uid):
            return
        del self.records[key]
        self._awaited.pop(key, None)
        self._passed.pop(key, None)
        self._unindex(old)
        self._notify(old, None)

    def _index(self, rec: SandboxRecord) -> None:
        if rec.pool_key:
            self._by_pool.setdefault(rec.pool_key, set()).add(rec.key)
        if rec.claim:
            self._by_claim.setdefault(join_key(rec.namespace, rec.claim), set()).add(rec.key)
        if rec.holds_slot and rec.node:
            self.node_load[rec.node] += 1
            if rec.pool_key:
                self.node_pool_load.setdefault(rec.node, Counter())[rec.pool_key] += 1

    def _unindex(self, rec: SandboxRecord) -> None:
        if rec.claim:
            claimed = self._by_claim.get(join_key(rec.namespace, rec.claim))
            if claimed is not None:
                claimed.discard(rec.key)
                if not claimed:
                    del self._by_claim[join_key(rec.namespace, rec.claim)]
        if rec.pool_key:
            keys = self._by_pool.get(rec.pool_key)
            if keys is not None:
                keys.discard(rec.key)
                if not keys:
                    del self._by_pool[rec.pool_key]
        if rec.holds_slot and rec.node:
            self.node_load[rec.node] -= 1
            if self.node_load[rec.node] <= 0:
                del self.node_load[rec.node]
            if rec.pool_key:
                per_pool = self.node_pool_load.get(rec.node)
                if per_pool is not None:
                    per_pool[rec.pool_key] -= 1
                    if per_pool[rec.pool_key] <= 0:
                        del per_pool[rec.pool_key]
                    if not per_pool:
                        del self.node_pool_load[rec.node]

    def _notify(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        for listener in self.listeners:
            try:
                listener(old, new)
            except Exception:
                log.exception("sandbox cache listener failed")
