"""Where a Pending sandbox goes: a pure choice over a snapshot of the fleet.

Only a node that is READY at ``now`` (its lease fresh), not Disabled and without a
``DiskPressure`` condition True, with a free slot under
``status.capacity.sandboxes``, is a candidate. Among candidates a
pool's members are spread first (fewest members of the same pool on the node),
then the least loaded node wins (non-terminal sandboxes over capacity), then the
name, so the same snapshot always gives the same answer.

Spreading before load is the trade-off: a pool survives the loss of one node
with the fewest members lost, even when that leaves nodes unevenly full. When
nothing fits, the answer says why in the words ``kubectl describe`` shows
(``0/3 nodes are available: 1 NotReady, 2 at capacity``), so a waiting sandbox
explains itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sandlot.api.node import NodePhase
from sandlot.api.placement import Taint
from sandlot.policy.placement import Placement, misfit


class Unschedulable(StrEnum):
    """Why no node fits, most fundamental first."""

    NO_NODES = "NoNodes"
    ALL_DISABLED = "AllNodesDisabled"
    NO_READY_NODE = "NoReadyNode"
    ALL_AT_CAPACITY = "AllNodesAtCapacity"
    DISK_PRESSURE = "DiskPressure"
    NO_MATCHING_NODE = "NoMatchingNode"


@dataclass(frozen=True)
class NodeSlot:
    """What the scheduler knows of one node.

    ``phase`` is the node's observed phase; ``ready_until`` (its lease expiry) makes a
    Ready node stop counting at the moment its lease runs out, even if nobody has
    written NotReady yet. ``capacity`` is ``status.capacity.sandboxes`` (0 until the
    agent reports it); ``sandboxes`` counts the node's non-terminal sandboxes;
    ``pool_members`` counts them by pool key (``namespace/pool``).
    """

    name: str
    phase: NodePhase | str
    unschedulable: bool
    capacity: int
    sandboxes: int
    pool_members: Mapping[str, int] = field(default_factory=dict)
    ready_until: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    runtime_handlers: frozenset[str] = frozenset()
    """``status.runtimeHandlers``: the handlers its containerd offers."""
    disk_pressure: bool = False
    """Its ``DiskPressure`` condition is True: nothing new is placed on it."""

    def ready(self, now: datetime) -> bool:
        if self.unschedulable or self.phase != NodePhase.READY:
            return False
        return self.ready_until is None or now < self.ready_until

    @property
    def free(self) -> int:
        return max(self.capacity - self.sandboxes, 0)


@dataclass(frozen=True)
class SandboxRequest:
    """The sandbox to place: its key for messages, its pool key (None: no pool), its
    placement (joined with its RuntimeClass's) and the runtime handler its class
    names (None: no class, any node's default)."""

    key: str
    pool: str | None = None
    placement: Placement | None = None
    handler: str | None = None


@dataclass(frozen=True)
class Choice:
    node: str | None
    reason: Unschedulable | None = None
    message: str = ""

    @property
    def placed(self) -> bool:
        return self.node is not None


def _spread_key(slot: NodeSlot, pool: str | None) -> tuple[int, float, int, str]:
    same_pool = slot.pool_members.get(pool, 0) if pool is not None else 0
    load = slot.sandboxes / slot.capacity if slot.capacity else 1.0
    return (same_pool, load, slot.sandboxes, slot.name)


def choose_node(sandbox: SandboxRequest, nodes: Sequence[NodeSlot], now: datetime) -> Choice:
    """The node ``sandbox`` should be bound to, or None and why none fits."""
    handled = [n for n in nodes if sandbox.handler is None or sandbox.handler in n.runtime_handlers]
    allowed = [n for n in handled if misfit(sandbox.placement, n.labels, n.taints) is None]
    fits = [n for n in allowed if n.ready(now) and not n.disk_pressure and n.free > 0]
    if fits:
        best = min(fits, key=lambda n: _spread_key(n, sandbox.pool))
        return Choice(node=best.name)
    return _why_not(
        allowed,
        now,
        total=len(nodes),
        no_handler=len(nodes) - len(handled),
        handler=sandbox.handler,
    )


def _why_not(
    nodes: Sequence[NodeSlot],
    now: datetime,
    *,
    total: int,
    no_handler: int = 0,
    handler: str | None = None,
) -> Choice:
    """Why none of ``nodes`` (those the sandbox's handler and placement allow, of
    ``total``; ``no_handler`` lack its runtime handler) fits."""
    excluded = total - len(nodes) - no_handler
    if total == 0:
        return Choice(
            None, Unschedulable.NO_NODES, "0/0 nodes are available: no SandboxNode exists"
        )
    disabled = sum(1 for n in nodes if n.unschedulable)
    ready = [n for n in nodes if n.ready(now)]
    not_ready = len(nodes) - disabled - len(ready)
    pressed = sum(1 for n in ready if n.disk_pressure)
    full = len(ready) - pressed  # every other Ready node is full, or one would have fitted
    parts = [
        f"{count} {what}"
        for count, what in (
            (no_handler, f'no runtime handler "{handler}"'),
            (excluded, "untolerated taint or node selector/affinity mismatch"),
            (not_ready, "NotReady"),
            (disabled, "Disabled"),
            (pressed, "under disk pressure"),
            (full, "at capacity"),
        )
        if count
    ]
    message = f"0/{total} nodes are available: {', '.join(parts)}"
    if not nodes:
        return Choice(None, Unschedulable.NO_MATCHING_NODE, message)
    if disabled == len(nodes):
        return Choice(None, Unschedulable.ALL_DISABLED, message)
    if not ready:
        return Choice(None, Unschedulable.NO_READY_NODE, message)
    if pressed and not full:
        return Choice(None, Unschedulable.DISK_PRESSURE, message)
    return Choice(None, Unschedulable.ALL_AT_CAPACITY, message)
