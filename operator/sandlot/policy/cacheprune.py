"""What a CachePrune request covers, which of its nodes can never answer, and
its phase: pure decisions for the operator's CachePrune controller.

A request waits for one result per targeted node, written by that node's agent.
An agent that is not running never writes one, so a request naming a node that
does not exist, or whose agent's lease has run out, would wait forever; the
operator writes such a node's result itself, as an error saying why, and the
person waiting gets an answer instead of a timeout.

Whether an agent can answer is judged by its lease (``now < renewTime +
leaseDurationSeconds``, the same test that makes a node Ready), not by the
phase alone: a drained (Disabled) node still runs its agent, and clearing a
drained node's cache is a normal maintenance step, so only a Disabled node whose
lease has also run out is refused. The phase is used for the wording.

Targets are fixed once resolved (``spec.nodes``, or every SandboxNode at that
moment): a node registered later is not silently added to a request someone is
already waiting on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sandlot.api.cacheprune import CachePrunePhase
from sandlot.api.node import NodePhase
from sandlot.policy.imagegc import PassKind, pass_for_request


@dataclass(frozen=True)
class NodeReach:
    """What the operator knows of a targeted node that has not answered yet."""

    phase: NodePhase | None
    """The SandboxNode's ``status.phase``; None before the node-health controller wrote one."""
    lease_expires_at: datetime | None
    """``renewTime + leaseDurationSeconds`` of the node's agent Lease; None when there is
    no Lease or it was never renewed (the agent never proved it was alive)."""

    def agent_alive(self, now: datetime) -> bool:
        return self.lease_expires_at is not None and now < self.lease_expires_at


@dataclass(frozen=True)
class PruneDecision:
    targets: tuple[str, ...]
    errors: Mapping[str, str] = field(default_factory=dict)
    """Results to write now: node -> why its agent cannot answer."""
    phase: CachePrunePhase = CachePrunePhase.RUNNING
    pass_kind: PassKind = "watermark"
    """The pass the request asks for (written into the error results: the pass that
    would have run)."""

    def changes(self, current_phase: str | None, current_targets: Iterable[str]) -> bool:
        """Whether this decision differs from the status as stored."""
        return bool(self.errors) or (
            current_phase != self.phase or tuple(current_targets) != self.targets
        )


def resolve_targets(spec_nodes: Iterable[str], existing: Iterable[str]) -> tuple[str, ...]:
    """``spec.nodes`` (duplicates dropped, order kept), or every existing node, sorted."""
    named = tuple(dict.fromkeys(n for n in spec_nodes if n))
    return named if named else tuple(sorted(set(existing)))


def unreachable_reason(name: str, node: NodeReach | None, now: datetime) -> str | None:
    """Why ``name``'s agent cannot answer, or None when it can (so the request waits)."""
    if node is None:
        return f'node "{name}" does not exist'
    if node.agent_alive(now):
        return None
    if node.phase is None:
        return None  # brand new: the node-health controller has not judged it yet
    expired = (
        f"its lease expired at {node.lease_expires_at.isoformat()}"
        if node.lease_expires_at is not None
        else "it has no agent lease"
    )
    if node.phase == NodePhase.DISABLED:
        return f'node "{name}" is Disabled and its agent is not running ({expired})'
    return f'node "{name}" is NotReady: its agent is not running ({expired})'


def prune_phase(
    targets: Iterable[str], errors_by_node: Mapping[str, str | None]
) -> CachePrunePhase:
    """Running while a target has no result; then Failed if any result has an error,
    else Complete. ``errors_by_node`` holds one entry per result written (None: no error)."""
    wanted = tuple(targets)
    if any(t not in errors_by_node for t in wanted):
        return CachePrunePhase.RUNNING
    if any(errors_by_node[t] for t in wanted):
        return CachePrunePhase.FAILED
    return CachePrunePhase.COMPLETE


def decide(
    *,
    all_: bool,
    spec_nodes: Iterable[str],
    current_phase: str | None,
    current_targets: Iterable[str],
    results: Mapping[str, str | None],
    nodes: Mapping[str, NodeReach],
    now: datetime,
) -> PruneDecision:
    """The request's targets, the error results to write, and its phase.

    ``results`` maps each node that already answered to its error (None when it
    succeeded); ``nodes`` holds every existing SandboxNode the operator looked at
    (it need only hold the targets without a result once targets are resolved).
    A request still ``Pending`` (or without a phase) has not been resolved yet.
    """
    resolved = current_phase not in (None, CachePrunePhase.PENDING)
    targets = tuple(current_targets) if resolved else resolve_targets(spec_nodes, nodes)
    errors: dict[str, str] = {}
    for target in targets:
        if target in results:
            continue
        reason = unreachable_reason(target, nodes.get(target), now)
        if reason is not None:
            errors[target] = reason
    phase = prune_phase(targets, {**results, **errors})
    return PruneDecision(targets, errors, phase, pass_for_request(all_))


TERMINAL_PRUNE_PHASES: frozenset[str] = frozenset(
    {CachePrunePhase.COMPLETE, CachePrunePhase.FAILED}
)


__all__ = [
    "TERMINAL_PRUNE_PHASES",
    "NodeReach",
    "PruneDecision",
    "decide",
    "prune_phase",
    "resolve_targets",
    "unreachable_reason",
]
