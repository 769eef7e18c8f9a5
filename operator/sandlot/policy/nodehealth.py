"""Node health: when a node's sandboxes are declared Dead, decided from plain data and ``now``.

A node whose lease expires is not yet a dead node. Containers survive an agent
restart or upgrade on containerd, and the agent re-adopts them on boot; marking
them Dead at the first missed renewal would turn every restart into churn. So a
NotReady node gets a grace period (default 300 s), counted from the moment its
lease expired rather than the moment the operator noticed, and only then are its
non-terminal sandboxes marked Dead (reason ``NodeLost``). A generous grace is the
price of never breaking the restart path; a Dead sandbox is replaced by its pool
within seconds of that.

Once a node is handled, a latch in its status (``health.handledAt``) makes every
later resync a no-op: no list, no patch. The latch clears when the node recovers,
is drained or deleted, and a lease renewed since the latch was set starts a new
episode even if the operator never saw the node Ready in between.

Drained (Disabled) nodes are left to the drain, with one exception: a drained node
whose lease has been expired for longer than ``drain_timeout`` is a drain that
died with its node, and its leftovers are marked Dead (reason ``DrainAbandoned``).

Liveness is judged on the operator's clock only (``sandlot.policy.liveness``): the
controller passes the last renewal it *observed*, timed when it saw the Lease change,
never the agent's ``renewTime`` stamp, so a skewed node clock moves nothing; and on
its monotonic clock, so a wall-clock step does not either (the wall clock: ``stamp``).

Everything the controller persists lives in the node's status, so an operator
restart or a leader change neither restarts nor forgets a grace period. Nothing
here reads a clock or talks to the API server; :func:`decide` returns what to do
and the status to write, and the controller does it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from sandlot.api.common import Condition
from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.api.reasons import SandboxReason
from sandlot.api.settings import Duration
from sandlot.policy.disruption import (
    FleetSummary,
    GuardSettings,
    guard_active,
    next_hold_report,
)
from sandlot.policy.liveness import lease_expiry, observed_phase
from sandlot.policy.nodeconditions import hold_conditions
from sandlot.policy.nodeconditions import ready_conditions as ready_conditions

# --- inputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """What the controller read of one SandboxNode."""

    name: str
    unschedulable: bool
    """``spec.unschedulable`` (set by ``sandlot drain``)."""
    first_seen: datetime
    """When the operator first saw the node (``liveness.first_seen_at``): a node without
    an observed renewal is Ready until ``unseen_lease_duration`` after it."""
    phase: NodePhase | str | None = None
    """``status.phase`` as currently stored; None when the node has no status yet."""
    conditions: tuple[Condition, ...] = ()
    """``status.conditions`` as currently stored."""
    reap_requested: bool = False
    """An operator's ``sandlot nodes reap`` decision (``spec.reap``) names the episode
    recorded in the stored status (its unhealthySince, compared as stored)."""

    def __post_init__(self) -> None:
        _require_aware("first_seen", self.first_seen)


class HealthTracking(Protocol):
    """``status.health`` as stored; :class:`NodeHealthTracking` is one."""

    @property
    def unhealthy_since(self) -> datetime | None: ...
    @property
    def handled_at(self) -> datetime | None: ...
    @property
    def handled_count(self) -> int | None: ...
    @property
    def last_renewal(self) -> ObservedRenewal | None: ...


class NodeHealthSettings(BaseModel):
    """How long the controller waits. Validated once, at construction (the operator's
    settings nest this model: ``--grace-period``, ``--agent-lease-duration``,
    ``--drain-timeout``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grace_period: Duration = Field(
        default=timedelta(seconds=300),
        gt=timedelta(0),
        description="How long a NotReady node's sandboxes are left alone, counted from its "
        "lease's expiry, before they are marked Dead. Longer protects slow agent restarts; "
        "shorter moves traffic off a dead node sooner.",
    )
    unseen_lease_duration: Duration = Field(
        default=timedelta(seconds=60),
        gt=timedelta(0),
        description="How long a SandboxNode whose Lease the operator never saw counts as "
        "Ready after the operator first saw it; set it to the agents' lease duration.",
    )
    drain_timeout: Duration = Field(
        default=timedelta(minutes=10),
        gt=timedelta(0),
        description="How long a drained (Disabled) node's lease may stay expired before its "
        "remaining sandboxes are marked Dead with reason DrainAbandoned.",
    )


# --- decisions --------------------------------------------------------------------------


class DecisionKind(StrEnum):
    CLEAR = "Clear"
    """Ready: tracking and latch cleared. Nothing else."""
    CLEAR_DISABLED = "ClearDisabled"
    """Disabled: tracking and latch cleared; the drain does its own cleanup."""
    START_TRACKING = "StartTracking"
    """NotReady, newly seen, within grace: record unhealthySince; wake at the deadline."""
    WAIT = "Wait"
    """NotReady, already tracked, within grace: nothing; wake at the deadline."""
    REAP = "Reap"
    """NotReady, grace over, not handled: mark non-terminal sandboxes Dead (NodeLost)."""
    MANUAL_REAP = "ManualReap"
    """NotReady, an operator decided the node is lost: mark its sandboxes Dead now,
    within grace or while the guard holds (ManualReap)."""
    DRAIN_ABANDONED = "DrainAbandoned"
    """Disabled with a lease expired for drain_timeout: mark leftovers Dead (DrainAbandoned)."""
    HANDLED = "Handled"
    """Latched: nothing to do. No list, no patch."""
    HOLD = "Hold"
    """Would mark sandboxes Dead, but the mass-failure guard is active: mark nothing."""
    DELETED = "Deleted"
    """The SandboxNode is gone: mark its non-terminal sandboxes Dead (NodeDeleted)."""


# Kinds after which the controller lists the node's non-terminal sandboxes and marks
# them Dead; all but DELETED then latch (Decision.latched); DELETED has no status.
LATCHING_KINDS: frozenset[DecisionKind] = frozenset(
    {DecisionKind.REAP, DecisionKind.MANUAL_REAP, DecisionKind.DRAIN_ABANDONED}
)
MARKING_KINDS: frozenset[DecisionKind] = LATCHING_KINDS | {DecisionKind.DELETED}


class StatusPatch(BaseModel):
    """The node-health part of a SandboxNode's status, as it should be after a decision."""

    model_config = ConfigDict(frozen=True)

    phase: NodePhase
    health: NodeHealthTracking
    conditions: tuple[Condition, ...] | None = None
    """The whole conditions list when it changes; None leaves it alone."""

    def wire(self) -> dict[str, Any]:
        """A JSON merge patch body for the status subresource.

        Cleared tracking fields are sent as nulls, which a merge patch needs to remove
        them; conditions, a list, are replaced whole and only sent when they change.
        """
        body: dict[str, Any] = {
            "phase": str(self.phase),
            "health": self.health.model_dump(by_alias=True, mode="json"),
        }
        if self.conditions is not None:
            body["conditions"] = [c.wire() for c in self.conditions]
        return body


@dataclass(frozen=True)
class Decision:
    """What the node-health controller does for one node on one pass."""

    kind: DecisionKind
    phase: NodePhase | None
    """The node's observed phase, written as ``status.phase``; None once it is deleted."""
    tracking: NodeHealthTracking
    """``status.health`` as it should be now (before any latch this pass sets)."""
    patch: StatusPatch | None
    """The status to write, or None when the stored status already says it all."""
    reason: str | None = None
    """For the marking kinds: the reason each sandbox is marked Dead with."""
    unhealthy_since: datetime | None = None
    """When the node's current unhealthy episode began (its lease's expiry)."""
    deadline: datetime | None = None
    """When the grace period (or, for a Disabled node, the drain timeout) ends."""
    wake_at: datetime | None = None
    """When to decide again at the latest; None leaves it to the regular timer."""
    was_tracking: bool = False
    """The stored status had an unhealthySince (for CLEAR: something recovered)."""
    was_handled: bool = False
    """The stored status had the handled latch set."""
    guard_active: bool = False
    """The mass-failure guard is active fleet-wide (report it even when not HOLD)."""

    @property
    def held_since(self) -> datetime | None:
        """For a HOLD, when the guard began holding this node back: its deadline."""
        return self.deadline if self.kind is DecisionKind.HOLD else None

    @property
    def marks_dead(self) -> bool:
        """The controller lists the node's non-terminal sandboxes and marks them Dead."""
        return self.kind in MARKING_KINDS

    @property
    def recovered(self) -> bool:
        """A Ready node left tracking or the latch behind: worth one Recovered event."""
        return self.kind is DecisionKind.CLEAR and (self.was_tracking or self.was_handled)

    def latched(self, handled_at: datetime, marked: int) -> StatusPatch:
        """The status to write once every sandbox was marked Dead: the handled latch set.

        Call it only when all marks succeeded; after a partial failure write
        :attr:`patch` instead, so the next pass retries.
        """
        if self.kind not in LATCHING_KINDS:
            raise ValueError(f"a {self.kind} decision sets no latch")
        if marked < 0:
            raise ValueError(f"marked must be >= 0, got {marked}")
        _require_aware("handled_at", handled_at)
        health = self.tracking.model_copy(
            update={"handled_at": handled_at, "handled_count": marked}
        )
        assert self.phase is not None
        conditions = self.patch.conditions if self.patch is not None else None
        return StatusPatch(phase=self.phase, health=health, conditions=conditions)


def decide(
    node: NodeView,
    renewal: ObservedRenewal | None,
    tracking: HealthTracking | None,
    now: datetime,
    fleet: FleetSummary,
    guard: GuardSettings,
    settings: NodeHealthSettings | None = None,
    stamp: datetime | None = None,
) -> Decision:
    # Long on purpose: it is SPEC section 3's table, one branch per row, read top down.
    """Decide what the node-health controller does for ``node`` at ``now`` (``stamp``,
    the wall clock's now, is the time a condition changed carries; ``now`` when None).

    ``renewal`` is the last renewal of the node's Lease the operator observed
    (``liveness.observe_renewal``; None when it never saw one);
    ``tracking`` is the node's stored ``status.health`` (None when it has none);
    ``fleet`` counts every SandboxNode's observed phase, this one included.

    While the guard holds, the grace period keeps counting: a HOLD records
    unhealthySince like any other pass, so when the fraction drops, nodes whose grace
    ended during the hold are reaped on the next pass, and nodes still within grace
    keep their original deadline. The guard never blocks tracking, only marking.
    A HOLD wakes at the next whole ``guard.report_every`` since it began, so a hold
    that lasts is reported again (``hold_reminder_due``).

    An operator's reap decision (``node.reap_requested``) for the recorded episode of a
    NotReady node marks it at once (MANUAL_REAP): grace and guard protect against a
    guess, and this is no guess. A renewal since starts a new episode it does not name.
    """
    settings = settings or NodeHealthSettings()
    _require_aware("now", now)
    stored = _snapshot(tracking)
    was_tracking = stored.unhealthy_since is not None
    was_handled = stored.handled_at is not None
    held = guard_active(fleet, guard)
    unseen = settings.unseen_lease_duration
    phase = observed_phase(node.unschedulable, renewal, node.first_seen, unseen, now)
    expiry = lease_expiry(renewal, node.first_seen, unseen)

    def make(
        kind: DecisionKind,
        desired: NodeHealthTracking,
        *,
        reason: str | None = None,
        deadline: datetime | None = None,
        wake_at: datetime | None = None,
    ) -> Decision:
        conditions = hold_conditions(node.conditions, kind is DecisionKind.HOLD, stamp or now)
        return Decision(
            kind=kind,
            phase=phase,
            tracking=desired,
            patch=_patch_if_changed(node, stored, phase, desired, conditions),
            reason=reason,
            unhealthy_since=desired.unhealthy_since,
            deadline=deadline,
            wake_at=wake_at,
            was_tracking=was_tracking,
            was_handled=was_handled,
            guard_active=held,
        )

    if phase is NodePhase.READY:
        return make(DecisionKind.CLEAR, NodeHealthTracking())

    if phase is NodePhase.DISABLED:
        abandon_at = expiry + settings.drain_timeout
        if now < abandon_at:
            # Wake at the exact moment the drain counts as abandoned, but only once the
            # lease has expired: a live agent's renewals keep pushing that moment on.
            wake = abandon_at if now >= expiry else None
            return make(
                DecisionKind.CLEAR_DISABLED, NodeHealthTracking(), deadline=abandon_at, wake_at=wake
            )
        episode = _episode(stored, expiry, renewal)
        if episode.handled_at is not None:
            return make(DecisionKind.HANDLED, episode, deadline=abandon_at)
        if held:
            wake = next_hold_report(abandon_at, now, guard.report_every)
            return make(DecisionKind.HOLD, episode, deadline=abandon_at, wake_at=wake)
        return make(
            DecisionKind.DRAIN_ABANDONED,
            episode,
            reason=SandboxReason.DRAIN_ABANDONED,
            deadline=abandon_at,
        )

    episode = _episode(stored, expiry, renewal)
    assert episode.unhealthy_since is not None
    deadline = episode.unhealthy_since + settings.grace_period
    if episode.handled_at is not None:
        return make(DecisionKind.HANDLED, episode, deadline=deadline)
    if node.reap_requested and episode.unhealthy_since == stored.unhealthy_since:
        return make(
            DecisionKind.MANUAL_REAP, episode, reason=SandboxReason.MANUAL_REAP, deadline=deadline
        )
    if now < deadline:
        new = episode.unhealthy_since != stored.unhealthy_since
        kind = DecisionKind.START_TRACKING if new else DecisionKind.WAIT
        return make(kind, episode, deadline=deadline, wake_at=deadline)
    if held:
        wake = next_hold_report(deadline, now, guard.report_every)
        return make(DecisionKind.HOLD, episode, deadline=deadline, wake_at=wake)
    return make(DecisionKind.REAP, episode, reason=SandboxReason.NODE_LOST, deadline=deadline)


def ready_until(
    node: NodeView, renewal: ObservedRenewal | None, now: datetime, unseen_duration: timedelta
) -> datetime | None:
    """Until when ``node`` stays READY on ``renewal``; None when it is not READY at ``now``.

    While a node is READY, ``decide`` answers CLEAR with a patch that depends only on
    the stored status (phase, tracking, conditions), never on the renewal or the
    time. So once a pass over one stored status decided CLEAR and had nothing to
    write, every later pass over that same status decides the same until this moment:
    a routine wake-up at a lease's old expiry, the lease renewed since, needs only it.
    """
    _require_aware("now", now)
    if observed_phase(node.unschedulable, renewal, node.first_seen, unseen_duration, now) is not (
        NodePhase.READY
    ):
        return None
    return lease_expiry(renewal, node.first_seen, unseen_duration)


def episode_handled(tracking: HealthTracking | None, expiry: datetime) -> bool:
    """Whether the node's current unhealthy episode is handled (its latch set): its
    grace ended and the guard let its sandboxes be marked, or an operator reaped it.

    ``expiry`` is when its last observed renewal runs out (``liveness.lease_expiry``,
    on the clock ``tracking`` is read on). A lease expiring after the recorded
    unhealthySince was renewed since: a new episode, not handled yet, whatever latch
    the stored status still carries.
    """
    return _episode(_snapshot(tracking), expiry, None).handled_at is not None


def decide_deleted(tracking: HealthTracking | None = None) -> Decision:
    """A SandboxNode was deleted: its non-terminal sandboxes become Dead (NodeDeleted).

    Deleting a node is a deliberate act, not a health signal, so the mass-failure
    guard does not apply. Its tracking goes with the object: there is no status left
    to write, so the decision carries no patch.
    """
    stored = _snapshot(tracking)
    return Decision(
        kind=DecisionKind.DELETED,
        phase=None,
        tracking=NodeHealthTracking(),
        patch=None,
        reason=SandboxReason.NODE_DELETED,
        was_tracking=stored.unhealthy_since is not None,
        was_handled=stored.handled_at is not None,
    )


# --- internals --------------------------------------------------------------------------


def _require_aware(name: str, moment: datetime) -> None:
    # Mixing naive and aware datetimes fails only at the first comparison, far from
    # the caller that passed the naive one.
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {moment!r}")


def _snapshot(tracking: HealthTracking | None) -> NodeHealthTracking:
    if tracking is None:
        return NodeHealthTracking()
    return NodeHealthTracking(
        unhealthy_since=tracking.unhealthy_since,
        last_renewal=tracking.last_renewal,
        handled_at=tracking.handled_at,
        handled_count=tracking.handled_count,
    )


def _episode(
    stored: NodeHealthTracking, expiry: datetime, renewal: ObservedRenewal | None
) -> NodeHealthTracking:
    """The tracking of the node's current unhealthy episode.

    A new episode records the renewal it began after, so a restarted or new leader
    that finds the Lease unchanged keeps its deadline. A renewal observed later than
    the recorded unhealthySince means the node was Ready in between, even if no pass
    saw it: a new episode starts with a fresh grace period and no latch. An earlier
    expiry never moves the recorded moment back: that would shorten a grace period
    already under way.
    """
    if stored.unhealthy_since is None or expiry > stored.unhealthy_since:
        return NodeHealthTracking(unhealthy_since=expiry, last_renewal=renewal)
    return stored


def _patch_if_changed(
    node: NodeView,
    stored: NodeHealthTracking,
    phase: NodePhase,
    desired: NodeHealthTracking,
    conditions: tuple[Condition, ...] | None,
) -> StatusPatch | None:
    if node.phase == phase and stored == desired and conditions is None:
        return None
    return StatusPatch(phase=phase, health=desired, conditions=conditions)
