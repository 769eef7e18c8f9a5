"""What a SandboxPool's controller does next: a pure plan over its members.

A pool keeps ``replicas`` non-terminal members. Terminal ones (Dead, Stopped,
Failed) no longer count, so a lost member is replaced by a new one, never
revived (the API forbids leaving a terminal phase anyway). Surplus goes the way a
ReplicaSet's does: the members that cost least to lose first (unbound Pending,
then Scheduled, then Running), and the newest of those first, because older
members have proved they run. Terminal members are kept for inspection up to
``history_limit`` and collected oldest first beyond it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase


@dataclass(frozen=True)
class Member:
    name: str
    phase: str
    bound: bool
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True)
class PoolPlan:
    create: int
    delete: tuple[str, ...]  # surplus live members, in deletion order
    collect: tuple[str, ...]  # terminal members beyond the history limit
    running: int
    pending: int
    terminal: int


def _surplus_rank(m: Member) -> int:
    if m.phase == SandboxPhase.PENDING and not m.bound:
        return 0
    if m.phase in (SandboxPhase.PENDING, SandboxPhase.SCHEDULED):
        return 1
    return 2


def plan_pool(replicas: int, history_limit: int, members: Iterable[Member]) -> PoolPlan:
    everyone = list(members)
    live = [m for m in everyone if not m.terminal]
    terminal = [m for m in everyone if m.terminal]

    # Newest first within a rank: sort by age descending, then stable-sort by rank.
    by_newest = sorted(live, key=lambda m: (m.created_at, m.name), reverse=True)
    surplus = sorted(by_newest, key=_surplus_rank)[: max(len(live) - replicas, 0)]
    create = max(replicas - len(live), 0)

    oldest_first = sorted(terminal, key=lambda m: (m.finished_at or m.created_at, m.name))
    collect = oldest_first[: max(len(terminal) - history_limit, 0)]

    gone = {m.name for m in surplus}
    kept = [m for m in live if m.name not in gone]
    running = sum(1 for m in kept if m.phase == SandboxPhase.RUNNING)
    return PoolPlan(
        create=create,
        delete=tuple(m.name for m in surplus),
        collect=tuple(m.name for m in collect),
        running=running,
        pending=len(kept) - running + create,
        terminal=len(terminal) - len(collect),
    )
