"""The operator's one view of node liveness, shared by node health and the scheduler.

It is fed by the agents' Lease watch and keeps, per node, the last renewal it
observed, timed on the operator's own clock (``sandlot.policy.liveness``), and
when the view itself was last established and last heard from. The node-health
controller reaps from it and the scheduler places from it, so the two can never
disagree about which nodes are alive.

Its clock is the steady one (``steady_clock``): renewals, expiries and ``now``
move with ``time.monotonic()``, so a wall-clock step changes no verdict. Moments
kept in a node's status are wall-clock; ``from_status`` and ``to_status`` translate
at that boundary and remember each translation per node, so a moment this process
wrote reads back as exactly what it meant, whatever the wall clock did since, and
one another process wrote is translated once, when first read.

Thread-safety: the watch thread calls ``on_lease``, ``heard`` and ``restored``;
the event loop reads. Every method takes the one lock; none does I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sandlot.adapters.objects import LeaseRecord
from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.policy.liveness import (
    LeaseView,
    LeaseViewState,
    first_seen_at,
    from_wall,
    lease_expiry,
    observe_renewal,
    observed_phase,
    reap_blocked_until,
    to_wall,
)
from sandlot.policy.probes import Probe, operator_ready

# Translations of status moments remembered per node: the few its status holds, plus
# those of a write whose echo has not arrived yet.
MOMENTS_KEPT = 8


def steady_clock(
    wall: Callable[[], datetime], monotonic: Callable[[], float]
) -> Callable[[], datetime]:
    """A datetime that moves with ``monotonic`` only: the wall clock is read once, now."""
    origin, start = wall(), monotonic()
    return lambda: origin + timedelta(seconds=monotonic() - start)


class LivenessView:
    def __init__(
        self,
        clock: Callable[[], datetime],
        *,
        unseen_duration: timedelta,
        staleness_bound: timedelta,
        wall: Callable[[], datetime] | None = None,
    ) -> None:
        """``clock`` is the steady clock every observation is timed on; ``wall`` the
        wall clock status moments are written in (``clock`` when None: no steps)."""
        self.clock = clock
        self.wall = wall or clock
        self.unseen_duration = unseen_duration
        self.staleness_bound = staleness_bound
        self._lock = threading.Lock()
        self._leases: dict[str, LeaseView] = {}
        self._renewals: dict[str, ObservedRenewal] = {}
        # A Lease met with no earlier observation (after a start or failover): when it
        # was met. It is resolved against the renewal the node's status records, which
        # the first query brings, so an unchanged Lease keeps its recorded deadline.
        self._unresolved: dict[str, datetime] = {}
        self._first_seen: dict[str, datetime] = {}
        self._since: datetime | None = None
        self._last_heard: datetime | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._moments: dict[str, dict[datetime, datetime]] = {}  # node -> {wall: steady}

    # -- inputs (watch thread) -------------------------------------------------------

    def subscribe(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(node)`` (on the watch thread) when a renewal revives a node:
        one whose last observed renewal had expired, or that had none. A routine
        renewal of a live node calls nothing: its next deadline is simply later."""
        self._listeners.append(callback)

    def on_lease_record(self, event_type: str, record: LeaseRecord) -> bool:
        """A Lease watch event; True when it revived the node."""
        if event_type == "DELETED":
            return self.on_lease(record.name, None)
        renew = record.renew_time.isoformat() if record.renew_time is not None else None
        return self.on_lease(record.name, LeaseView(renew, record.holder, record.duration_seconds))

    def on_lease(self, name: str, lease: LeaseView | None) -> bool:
        """Record a Lease as read (None: deleted); True when the renewal revived the node."""
        now = self.clock()
        with self._lock:
            revived = self._observe(name, lease, now)
        if revived:
            for callback in self._listeners:
                callback(name)
        return revived

    def _observe(self, name: str, lease: LeaseView | None, now: datetime) -> bool:
        if self._since is not None:  # an item of a list restoring the view proves nothing yet
            self._last_heard = now
        if lease is None:
            # Not a renewal and not a death: the last observed renewal still counts.
            self._leases.pop(name, None)
            return False
        before = self._leases.get(name)
        self._leases[name] = lease
        previous = self._renewals.get(name)
        if previous is None:
            if lease.renew_time is None:
                return False
            if name in self._unresolved:
                if before is not None and (before.renew_time, before.holder) != (
                    lease.renew_time,
                    lease.holder,
                ):
                    self._unresolved[name] = now  # renewed again: timed by the latest change
                return False
            self._unresolved[name] = now
            return True
        observed = observe_renewal(previous, lease, None, now)
        if observed is previous or observed is None:
            return False
        self._renewals[name] = observed
        return previous.expires_at <= now

    def heard(self) -> None:
        """The watch proved alive without an event (a clean re-watch, a bookmark)."""
        now = self.clock()
        with self._lock:
            self._last_heard = now

    def restored(self) -> None:
        """A full list re-established the view (after a start or any gap)."""
        now = self.clock()
        with self._lock:
            self._since = now
            self._last_heard = now

    def lost(self) -> None:
        """The watch failed: the view has a gap until a list restores it. It counts
        as neither established nor heard from until that list has *ended*
        (``reap_blocked_until`` blocks marking, then waits one lease more): the items
        of a list's first pages must not make the nodes on pages not yet received,
        still holding their renewals from before the gap, look expired."""
        with self._lock:
            self._since = None
            self._last_heard = None

    def forget(self, name: str) -> None:
        """The SandboxNode is gone."""
        with self._lock:
            self._leases.pop(name, None)
            self._renewals.pop(name, None)
            self._unresolved.pop(name, None)
            self._first_seen.pop(name, None)
            self._moments.pop(name, None)

    # -- the status boundary (event loop) ----------------------------------------------

    def from_status(self, name: str, tracking: NodeHealthTracking) -> NodeHealthTracking:
        """``tracking`` as stored (wall clock) with its moments on the steady clock."""
        stored = _moments(tracking)
        if not stored:
            return tracking
        steady_now, wall_now = self.clock(), self.wall()
        with self._lock:
            known = self._moments.setdefault(name, {})
            foreign = [m for m in stored if m not in known]
            for moment, steady in zip(
                foreign, from_wall(foreign, steady_now, wall_now), strict=True
            ):
                known[moment] = steady
            for moment in stored:  # the most recently used last
                known[moment] = known.pop(moment)
            translated = dict(known)
            _trim(known)
        return _map_moments(tracking, translated.__getitem__)

    def to_status(self, name: str, tracking: NodeHealthTracking) -> NodeHealthTracking:
        """``tracking`` (steady clock) with its moments as written to status (wall)."""
        steady_now, wall_now = self.clock(), self.wall()
        with self._lock:
            known = self._moments.setdefault(name, {})
            written = {v: k for k, v in known.items()}

            def wall(moment: datetime) -> datetime:
                # A moment read from status or written before goes back exactly as it
                # was: the status does not move because the wall clock did.
                found = written.get(moment)
                if found is None:
                    found = to_wall(moment, steady_now, wall_now)
                known.pop(found, None)
                known[found] = moment
                return found

            converted = _map_moments(tracking, wall)
            _trim(known)
        return converted

    def wall_time(self, moment: datetime) -> datetime:
        """A steady moment on the wall clock, for what people read (events, logs)."""
        return to_wall(moment, self.clock(), self.wall())

    # -- queries (event loop) ------------------------------------------------------

    def renewal(self, name: str, tracking: NodeHealthTracking) -> ObservedRenewal | None:
        """The last renewal of ``name``'s Lease observed, resolved against ``tracking``."""
        with self._lock:
            met = self._unresolved.pop(name, None)
            if met is not None:
                resolved = observe_renewal(None, self._leases.get(name), tracking.last_renewal, met)
                if resolved is not None:
                    self._renewals[name] = resolved
            found = self._renewals.get(name)
            if found is None and name not in self._first_seen:
                self._first_seen[name] = first_seen_at(tracking, self.clock(), self.unseen_duration)
            return found if found is not None else tracking.last_renewal

    def first_seen(self, name: str) -> datetime:
        with self._lock:
            seen = self._first_seen.get(name)
            if seen is None:
                seen = self._first_seen[name] = self.clock()
            return seen

    def phase(
        self, name: str, unschedulable: bool, tracking: NodeHealthTracking, now: datetime
    ) -> NodePhase:
        renewal = self.renewal(name, tracking)
        return observed_phase(
            unschedulable, renewal, self.first_seen(name), self.unseen_duration, now
        )

    def expiry(self, name: str, tracking: NodeHealthTracking) -> datetime:
        renewal = self.renewal(name, tracking)
        return lease_expiry(renewal, self.first_seen(name), self.unseen_duration)

    def lease_duration(self, name: str) -> timedelta:
        with self._lock:
            lease = self._leases.get(name)
            renewal = self._renewals.get(name)
        if lease is not None:
            return timedelta(seconds=lease.duration_seconds)
        if renewal is not None:
            return timedelta(seconds=renewal.lease_duration_seconds)
        return self.unseen_duration

    @property
    def established(self) -> bool:
        with self._lock:
            return self._since is not None

    def reap_blocked_until(self, name: str, now: datetime) -> datetime | None:
        """When marking ``name``'s sandboxes may go ahead; None when it may now."""
        with self._lock:
            state = LeaseViewState(since=self._since, last_heard=self._last_heard)
        return reap_blocked_until(state, self.lease_duration(name), self.staleness_bound, now)

    def readiness(self, started: bool, unsynced: Sequence[str] = ()) -> Probe:
        """The operator's readiness probe (``sandlot.policy.probes.operator_ready``):
        called from the HTTP thread, hence under the lock like the watch's inputs."""
        with self._lock:
            state = LeaseViewState(since=self._since, last_heard=self._last_heard)
        return operator_ready(started, state, self.clock(), self.staleness_bound, unsynced)


def _moments(tracking: NodeHealthTracking) -> list[datetime]:
    found = [tracking.unhealthy_since, tracking.handled_at]
    if tracking.last_renewal is not None:
        found.append(tracking.last_renewal.observed_at)
    return [m for m in found if m is not None]


def _map_moments(
    tracking: NodeHealthTracking, convert: Callable[[datetime], datetime]
) -> NodeHealthTracking:
    update: dict[str, Any] = {}
    if tracking.unhealthy_since is not None:
        update["unhealthy_since"] = convert(tracking.unhealthy_since)
    if tracking.handled_at is not None:
        update["handled_at"] = convert(tracking.handled_at)
    if tracking.last_renewal is not None:
        observed = convert(tracking.last_renewal.observed_at)
        update["last_renewal"] = tracking.last_renewal.model_copy(update={"observed_at": observed})
    return tracking.model_copy(update=update) if update else tracking


def _trim(known: dict[datetime, datetime]) -> None:
    while len(known) > MOMENTS_KEPT:
        del known[next(iter(known))]
