"""What the programs' probes answer, from plain facts (the HTTP side is
``sandlot.adapters.health``).

Liveness says "this process is stuck: restart it"; readiness says "do not count
on me yet". They fail for different reasons, so they are different checks:

- operator liveness: its event loop (where every controller runs) ticked within
  ``stall_after``; a replica whose loop is blocked is restarted;
- operator readiness: kopf has started, the caches every pass reads from have
  taken in their first complete list (a replica still listing would act on a part
  of the fleet), and the replica's view of the agents' Leases is established and
  was heard from within its staleness bound (a replica cut off from the API server
  is not counted on, and is not restarted for it);
- agent liveness: the process answers (its HTTP thread runs);
- agent readiness: the start-up sweep is done (the node registered, re-adoption
  decided) and containerd answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sandlot.policy.liveness import LeaseViewState


@dataclass(frozen=True)
class Probe:
    ok: bool
    reason: str


def operator_live(last_tick: float | None, now: float, stall_after: float) -> Probe:
    """``last_tick``/``now`` in monotonic seconds; None: the loop has not ticked yet."""
    if last_tick is None:
        return Probe(True, "event loop starting")
    stalled = now - last_tick
    if stalled > stall_after:
        return Probe(False, f"event loop blocked for {stalled:.0f}s (limit {stall_after:.0f}s)")
    return Probe(True, "event loop running")


def operator_ready(
    started: bool,
    view: LeaseViewState,
    now: datetime,
    staleness_bound: timedelta,
    unsynced: Sequence[str] = (),
) -> Probe:
    """``unsynced``: the caches whose first list is not in yet, by name."""
    if not started:
        return Probe(False, "controllers not started yet")
    if unsynced:
        return Probe(False, f"caches not synced yet: {', '.join(unsynced)}")
    if view.since is None:
        return Probe(False, "the agents' Leases not listed yet (first, or after a gap)")
    heard = view.last_heard or view.since
    silent = now - heard
    if silent > staleness_bound:
        return Probe(
            False,
            f"API server not heard from for {silent.total_seconds():.0f}s "
            f"(limit {staleness_bound.total_seconds():.0f}s)",
        )
    return Probe(True, "ready")


def agent_ready(startup_done: bool, containerd_error: str | None) -> Probe:
    """``containerd_error``: why containerd did not answer just now; None if it did."""
    if not startup_done:
        return Probe(False, "start-up sweep not done yet")
    if containerd_error is not None:
        return Probe(False, f"containerd unreachable: {containerd_error}")
    return Probe(True, "ready")
