"""Node liveness on the operator's own clock: renewals observed, never clocks compared.

An agent stamps its Lease's ``renewTime`` with its own clock. Comparing that stamp
with the operator's clock turns clock skew into wrong verdicts: an agent six minutes
slow looks dead while it renews every ten seconds, one ten minutes fast stays Ready
ten minutes after it died. So, as Kubernetes' node lifecycle controller does with its
probe timestamps, the operator only asks whether the Lease *changed* (a new
renewTime or holder) and times that change on its own clock: a node is Ready while
a renewal was observed within ``leaseDurationSeconds``.

- Deleting a Lease is neither a renewal nor a death: the last observed renewal
  still counts, and a recreated Lease is a new renewal.
- A restarted (or newly elected) operator has seen nothing yet. A Lease it finds
  unchanged since the renewal recorded in the node's status keeps that record, so
  an episode under way keeps its deadline; any other Lease counts as renewed now,
  which errs towards life: at worst one lease duration later than a perfect
  observer would decide, never earlier.
- A node whose Lease was never seen is Ready until ``leaseDurationSeconds`` after
  the operator first saw the node.

Every moment here is on the operator's *steady* clock: a datetime that moves with
``time.monotonic()`` and never steps, so an NTP step or a resumed VM neither keeps
a dead node Ready (a step back) nor expires every live one (a step forward). The
wall clock appears only where a moment is written to status, or read back from it
by a process that did not observe it (``to_wall``, ``from_wall``).

The second half of this module says when the operator's view of the Leases is too
young or too old to reap from: a view just (re)established has not yet had one
lease duration to see renewals, and a view not heard from for longer than its
staleness bound (a watch that died silently) says nothing about the present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal


@dataclass(frozen=True)
class LeaseView:
    """The part of a node's Lease as read that identifies a renewal.

    The controller passes ``None`` instead of a LeaseView when the Lease does not exist.
    """

    renew_time: str | None
    """``spec.renewTime`` exactly as stored (opaque here: compared only for change)."""
    holder: str | None
    """``spec.holderIdentity``."""
    duration_seconds: int
    """``spec.leaseDurationSeconds``: how long one renewal keeps the node Ready."""

    def __post_init__(self) -> None:
        if self.duration_seconds < 0:
            raise ValueError(f"duration_seconds must be >= 0, got {self.duration_seconds}")


def observe_renewal(
    previous: ObservedRenewal | None,
    lease: LeaseView | None,
    recorded: ObservedRenewal | None,
    now: datetime,
) -> ObservedRenewal | None:
    """The last renewal observed after reading ``lease`` at ``now``.

    ``previous`` is what this operator observed before (None after its start);
    ``recorded`` is the renewal kept in the node's status when its current unhealthy
    episode began (None when there is no episode). A Lease that is gone, or never
    renewed, changes nothing.
    """
    known = previous if previous is not None else recorded
    if lease is None or lease.renew_time is None:
        return known
    if known is not None and known.same_renewal(lease.renew_time, lease.holder):
        return known
    return ObservedRenewal(
        renew_time=lease.renew_time,
        holder_identity=lease.holder,
        observed_at=now,
        lease_duration_seconds=lease.duration_seconds,
    )


def first_seen_at(
    tracking: NodeHealthTracking, now: datetime, unseen_duration: timedelta
) -> datetime:
    """When the operator counts a node without any observed renewal as first seen.

    ``now`` for a node it meets for the first time, unless the node's status records
    an episode that began without a renewal: then the moment that episode implies, so
    a restart does not hand a never-renewed node a fresh lease duration and grace.
    """
    if tracking.unhealthy_since is not None and tracking.last_renewal is None:
        return min(now, tracking.unhealthy_since - unseen_duration)
    return now


def lease_expiry(
    renewal: ObservedRenewal | None, first_seen: datetime, unseen_duration: timedelta
) -> datetime:
    """When the node stops (or stopped) being Ready, on the operator's clock."""
    if renewal is None:
        return first_seen + unseen_duration
    return renewal.expires_at


def observed_phase(
    unschedulable: bool,
    renewal: ObservedRenewal | None,
    first_seen: datetime,
    unseen_duration: timedelta,
    now: datetime,
) -> NodePhase:
    """Disabled when drained; Ready while a renewal observed is within its duration."""
    if unschedulable:
        return NodePhase.DISABLED
    if now < lease_expiry(renewal, first_seen, unseen_duration):
        return NodePhase.READY
    return NodePhase.NOT_READY


# --- the status boundary: steady moments <-> wall-clock moments ------------------------


def to_wall(moment: datetime, steady_now: datetime, wall_now: datetime) -> datetime:
    """``moment`` (steady clock) as the wall clock read at ``wall_now`` places it."""
    return moment + (wall_now - steady_now)


def from_wall(
    recorded: Sequence[datetime], steady_now: datetime, wall_now: datetime
) -> list[datetime]:
    """Wall-clock moments recorded together in status, as moments on the steady clock.

    What another process recorded is only as good as the two wall clocks agree. When
    the latest of them reads as later than now (this wall clock behind the writer's),
    all move back together until it is now: nothing recorded lies in the future, the
    spans between them (a lease, the time since the lease expired) stay as recorded,
    and a deadline only ever moves later.
    """
    offset = wall_now - steady_now
    moments = [m - offset for m in recorded]
    late = max(moments, default=steady_now) - steady_now
    if late > timedelta(0):
        moments = [m - late for m in moments]
    return moments


# --- how far the view of the Leases can be trusted -------------------------------------


@dataclass(frozen=True)
class LeaseViewState:
    """How continuous and how fresh the operator's view of the agents' Leases is."""

    since: datetime | None
    """When the current continuous view began (the last full list); None before one."""
    last_heard: datetime | None
    """When the watch last proved alive (an event, a bookmark, a clean re-watch)."""


def reap_blocked_until(
    view: LeaseViewState, lease_duration: timedelta, staleness_bound: timedelta, now: datetime
) -> datetime | None:
    """Why marking must wait, as the moment it may resume; None when it may go ahead.

    A view never established, or not heard from within ``staleness_bound``, blocks
    marking until it is re-established (returned as ``now + staleness_bound``, a
    moment to look again). A view re-established less than one lease duration ago
    blocks it until that duration has passed: agents cut off with the operator renew
    as soon as they can, and deserve one lease duration to be seen doing it.
    """
    if view.since is None or view.last_heard is None:
        return now + staleness_bound
    if now - view.last_heard > staleness_bound:
        return now + staleness_bound
    settled = view.since + lease_duration
    return settled if now < settled else None
