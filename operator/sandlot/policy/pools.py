"""What a SandboxPool's controller does next: a pure plan over its members.

A pool keeps ``replicas`` non-terminal members. Terminal ones (Dead, Stopped,
Failed) no longer count, so a lost member is replaced by a new one, never
revived (the API forbids leaving a terminal phase anyway). Surplus goes the way a
ReplicaSet's does: the members that cost least to lose first (unbound Pending,
then Scheduled, then Running), and the newest of those first, because older
members have proved they run. Terminal members are kept for inspection up to
``history_limit`` and collected oldest first beyond it.

**Rolling.** A member whose spec differs from the pool's template (``current``
false) is replaced the way a Deployment's RollingUpdate does it: at most
``replicas + maxSurge`` live members at once, and old members are deleted only
while at least ``replicas - maxUnavailable`` stay available: Ready (Running, its
readiness probe passed) on a Ready node for ``minReadySeconds``, counted from when
the operator first saw it Ready on its own clock (never from a time its node
wrote), so a member that crashes soon after it starts never counts (Kubernetes'
availableReplicas). ``readyReplicas`` counts the Ready members.
Percentages round up for the surge and down for the unavailable, as Kubernetes
does; both zero would deadlock, so the surge is then one.

**Back-off.** Members that keep failing (Failed, or Stopped by a crash: a
non-zero exit) are not replaced at once, over and over: after ``n`` failures in a
row (newest first, broken by a member that ended well or a newer member that
runs) replacements wait ``start * 2^(n-1)`` seconds (capped) from the last
failure, as the kubelet's CrashLoopBackOff does. Those failed members are kept
past the history limit while they count, so the back-off survives a restart.
While it is in force no old member is deleted either: a rollout whose new members
keep failing stops where it is, with the old ones still serving.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.policy.backoff import capped_doubling

CRASH_REASONS: frozenset[str] = frozenset({SandboxReason.EXITED, SandboxReason.OOM_KILLED})


def ended_by_fault(phase: str, reason: str | None, exit_code: int | None) -> bool:
    """A member that could not start, or crashed: what the failure back-off counts."""
    if phase == SandboxPhase.FAILED:
        return True
    return phase == SandboxPhase.STOPPED and reason in CRASH_REASONS and exit_code not in (None, 0)


@dataclass(frozen=True)
class Member:
    name: str
    phase: str
    bound: bool
    created_at: datetime
    finished_at: datetime | None = None
    current: bool = True
    """Its spec is the pool's template as it is now."""
    reason: str | None = None
    exit_code: int | None = None
    node_ready: bool = True
    """Its node is Ready: a member on a NotReady node serves nobody."""
    ready: bool = True
    """Its readiness probe passed (True without a probe)."""
    ready_since: datetime | None = None
    """Since when the operator has seen it Ready, on the clock ``now`` is read on
    (None: not seen Ready: available only without ``min_ready``). Never a node's
    time: a node's clock may be hours off the operator's."""

    @property
    def serving(self) -> bool:
        """Running, Ready, on a Ready node."""
        return self.phase == SandboxPhase.RUNNING and self.ready and self.node_ready

    def available(self, now: datetime | None, min_ready: timedelta) -> bool:
        """Counts as serving in a rollout: Ready on a Ready node for ``min_ready``."""
        if not self.serving:
            return False
        if min_ready <= timedelta(0) or now is None:
            return True
        return self.ready_since is not None and now - self.ready_since >= min_ready

    def available_at(self, min_ready: timedelta) -> datetime | None:
        """When it will count as available if it stays Ready (None: not Ready on a
        Ready node now, or not known since when)."""
        if not self.serving or self.ready_since is None:
            return None
        return self.ready_since + max(min_ready, timedelta(0))

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def failed(self) -> bool:
        """Ended by a fault of its own: could not start, or crashed."""
        return ended_by_fault(self.phase, self.reason, self.exit_code)


@dataclass(frozen=True)
class PoolPlan:
    create: int
    delete: tuple[str, ...]  # surplus (or replaced) live members, in deletion order
    collect: tuple[str, ...]  # terminal members beyond the history limit
    running: int
    pending: int
    terminal: int


@dataclass(frozen=True)
class Rollout:
    """``maxSurge`` / ``maxUnavailable``: a count, or a percentage of replicas (``"25%"``)."""

    max_surge: int | str = "25%"
    max_unavailable: int | str = "25%"


@dataclass(frozen=True)
class Backoff:
    start: timedelta = timedelta(seconds=10)
    cap: timedelta = timedelta(minutes=5)
    kept: int = 6
    """Failed members kept beyond the history limit while they count (2^5 x 10 s > cap)."""


@dataclass(frozen=True)
class PoolDecision:
    plan: PoolPlan
    updated: int
    """Live members from the current template, after the plan."""
    ready: int
    """Running members kept."""
    failures: int = 0
    """Members that failed in a row, newest first."""
    backoff_until: datetime | None = None
    """Replacements wait until then (None: no back-off in force)."""


NOT_TEMPLATE = ("nodeName", "operatingMode")  # the scheduler's, and the member's own state


def spec_hash(spec: Mapping[str, object]) -> str:
    """A short digest of a Sandbox spec without its ``nodeName`` (the scheduler's) and
    ``operatingMode`` (pausing one member is not a template change): a member whose
    digest equals its pool template's is current."""
    rest = {k: v for k, v in spec.items() if k not in NOT_TEMPLATE}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scaled(value: int | str, replicas: int, *, round_up: bool) -> int:
    """An int-or-percent setting as a member count."""
    if isinstance(value, int):
        return max(value, 0)
    text = value.strip()
    if text.endswith("%"):
        exact = replicas * float(text[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return max(int(text), 0)


def _surplus_rank(m: Member) -> int:
    if m.phase == SandboxPhase.PENDING and not m.bound:
        return 0
    if m.phase in (SandboxPhase.PENDING, SandboxPhase.SCHEDULED):
        return 1
    return 2


def _cheapest_first(members: Iterable[Member]) -> list[Member]:
    # Newest first within a rank: sort by age descending, then stable-sort by rank.
    by_newest = sorted(members, key=lambda m: (m.created_at, m.name), reverse=True)
    return sorted(by_newest, key=_surplus_rank)


def _surplus(members: list[Member], replicas: int) -> list[Member]:
    """The members beyond ``replicas``, cheapest to lose first; no sort when there are
    none (a pass over a large pool runs on every member event)."""
    extra = len(members) - replicas
    return _cheapest_first(members)[:extra] if extra > 0 else []


def failure_chain(members: list[Member]) -> list[Member]:
    """The failed members in a row, newest first; a newer member that runs breaks it."""
    ended = sorted(
        (m for m in members if m.terminal and m.finished_at is not None),
        key=lambda m: (m.finished_at, m.name),
        reverse=True,
    )
    chain: list[Member] = []
    for m in ended:
        if not m.failed:
            break
        chain.append(m)
    if chain:
        last = chain[0].finished_at
        assert last is not None
        if any(m.phase == SandboxPhase.RUNNING and m.created_at >= last for m in members):
            return []
    return chain


def _backoff_until(chain: list[Member], backoff: Backoff) -> datetime | None:
    if not chain:
        return None
    delay = capped_doubling(len(chain), backoff.start, backoff.cap)
    last = chain[0].finished_at
    assert last is not None
    until: datetime = last + delay
    return until


def _roll(
    replicas: int,
    live: list[Member],
    rollout: Rollout,
    available: frozenset[str],
    paused: bool,
) -> tuple[int, list[Member]]:
    """How many to create and which live members to delete (old or surplus).

    Old members go only while the available ones (``available``: Running on a Ready
    node for minReadySeconds) stay at ``replicas - maxUnavailable``; an old member
    that serves nobody costs nothing to remove. One that serves but is not available
    yet stays: an operator that just started counts every member's minReadySeconds
    from when it first saw it Ready, and must not take that for members not worth
    keeping. ``paused`` (the failure back-off is in force) keeps every old member:
    its replacements keep failing."""
    new = [m for m in live if m.current]
    old = [m for m in live if not m.current]
    if not old:
        return max(replicas - len(new), 0), _surplus(new, replicas)
    surge = scaled(rollout.max_surge, replicas, round_up=True)
    unavailable = scaled(rollout.max_unavailable, replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        surge = 1
    room = replicas + surge - len(live)
    create = max(min(replicas - len(new), room), 0)
    budget = sum(1 for m in live if m.name in available) - (replicas - unavailable)
    old_out: list[Member] = []
    for m in [] if paused else _cheapest_first(old):
        if not m.serving:
            old_out.append(m)
        elif m.name in available and budget > 0:
            old_out.append(m)
            budget -= 1
    return create, old_out + _surplus(new, replicas)


def decide_pool(
    replicas: int,
    history_limit: int,
    members: Iterable[Member],
    *,
    rollout: Rollout | None = None,
    backoff: Backoff | None = None,
    now: datetime | None = None,
    min_ready: timedelta = timedelta(0),
) -> PoolDecision:
    """The plan, with rolling (``rollout``; a member counts available once Running on a
    Ready node for ``min_ready``) and failure back-off (``backoff`` at ``now``), which
    stops old members' deletes as well as creates."""
    everyone = list(members)
    live = [m for m in everyone if not m.terminal]
    terminal = [m for m in everyone if m.terminal]
    chain = failure_chain(everyone) if backoff is not None else []
    until = _backoff_until(chain, backoff) if backoff is not None else None
    waiting = until is not None and now is not None and now < until
    if until is not None and now is not None and not waiting:
        until = None
    available = frozenset(m.name for m in live if m.available(now, min_ready))
    create, delete = _roll(replicas, live, rollout or Rollout(), available, waiting)
    if waiting:
        create = 0  # wait out the back-off; the pool is not gone, only patient
    kept_failures = {m.name for m in chain[: backoff.kept]} if backoff is not None else set()

    oldest_first = sorted(terminal, key=lambda m: (m.finished_at or m.created_at, m.name))
    collectable = [m for m in oldest_first if m.name not in kept_failures]
    collect = collectable[: max(len(terminal) - history_limit, 0)]

    gone = {m.name for m in delete}
    kept = [m for m in live if m.name not in gone]
    running = sum(1 for m in kept if m.phase == SandboxPhase.RUNNING)
    ready = sum(1 for m in kept if m.phase == SandboxPhase.RUNNING and m.ready)
    plan = PoolPlan(
        create=create,
        delete=tuple(m.name for m in delete),
        collect=tuple(m.name for m in collect),
        running=running,
        pending=len(kept) - running + create,
        terminal=len(terminal) - len(collect),
    )
    updated = sum(1 for m in kept if m.current) + create
    return PoolDecision(plan, updated, ready, len(chain), until)


def next_available(
    members: Iterable[Member], now: datetime, min_ready: timedelta
) -> datetime | None:
    """The first moment a Running member not yet available becomes so: a pool in a
    rollout looks again then, not at its next event."""
    coming = [at for m in members if (at := m.available_at(min_ready)) is not None and at > now]
    return min(coming, default=None)


@dataclass(frozen=True)
class RolloutProgress:
    done: bool
    message: str


def rollout_progress(
    name: str, generation: int, replicas: int, status: Mapping[str, object]
) -> RolloutProgress:
    """Where a pool's rollout stands, as ``kubectl rollout status`` words it: done once
    the controller has seen this generation and every member is current and Running
    with no old one left."""

    def count(key: str) -> int:
        value = status.get(key)
        return value if isinstance(value, int) else 0

    observed = status.get("observedGeneration")
    if not isinstance(observed, int) or observed < generation:
        return RolloutProgress(False, f'Waiting for pool "{name}" spec update to be observed...')
    updated, ready = count("updatedReplicas"), count("readyReplicas")
    live = count("running") + count("pending")
    if updated < replicas:
        return RolloutProgress(
            False,
            f'Waiting for pool "{name}" rollout to finish: {updated} out of {replicas} new '
            "members have been created...",
        )
    if live > replicas:
        return RolloutProgress(
            False,
            f'Waiting for pool "{name}" rollout to finish: {live - replicas} old members '
            "are pending termination...",
        )
    if ready < replicas:
        return RolloutProgress(
            False,
            f'Waiting for pool "{name}" rollout to finish: {ready} of {replicas} updated '
            "members are Running...",
        )
    return RolloutProgress(True, f'pool "{name}" successfully rolled out')


def plan_pool(replicas: int, history_limit: int, members: Iterable[Member]) -> PoolPlan:
    """The plan of a pool whose members all match its template, without back-off."""
    return decide_pool(replicas, history_limit, members).plan


__all__ = [
    "Backoff",
    "Member",
    "PoolDecision",
    "PoolPlan",
    "Rollout",
    "RolloutProgress",
    "decide_pool",
    "failure_chain",
    "next_available",
    "plan_pool",
    "rollout_progress",
    "scaled",
    "spec_hash",
]
