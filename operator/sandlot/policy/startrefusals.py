"""Which of the sandboxes the sync would start this node refuses, and why: pure.

A start the plan makes is judged on the node's facts, given as data
(``StartFacts``), in this order:

1. its RuntimeClass refused it (decided by the agent's class survey), or its
   placement, joined with its class's, does not admit this node (a hand-set
   ``spec.nodeName`` skips the scheduler, not this): it fails
   (``PlacementRefused``), unless its class cannot be read now;
2. it does not fit beside what runs or starts already (``policy.capacity``): it
   fails (``OverCapacity``);
3. the node starts nothing new now (disk pressure): it is held, not failed, and
   starts once the pressure clears;
4. its class cannot be read now: nothing this pass, the next one asks again.

Counted as started: non-terminal sandboxes that are not waiting to start, and
waiting ones with a container (a start under way). Each counts with its own
limits or the node's defaults, plus its RuntimeClass's overhead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from sandlot.api.common import split_key
from sandlot.api.reasons import SandboxReason
from sandlot.policy.capacity import Capacity, Recorded, Usage, over_capacity, usage_of
from sandlot.policy.limits import DefaultLimits
from sandlot.policy.placement import Placement, misfit, taints_of
from sandlot.policy.runtimeclass import RuntimeClassInfo, joined_placement


class Refusal(StrEnum):
    FAIL = "fail"
    """The sandbox ends Failed with the reason."""
    HOLD = "hold"
    """The sandbox waits, with the reason in its status."""
    WAIT = "wait"
    """Nothing this pass (its facts could not be read)."""


@dataclass(frozen=True)
class Refused:
    how: Refusal
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class StartFacts:
    """What the sync knows of its node and sandboxes when it judges starts."""

    node: str
    capacity: Capacity
    bodies: Mapping[str, Mapping[str, Any]]
    """The node's Sandboxes by key, as watched."""
    node_body: Mapping[str, Any] | None = None
    """The SandboxNode: its labels and taints admit or refuse a placement."""
    default_memory: str = ""
    """The memory limit a sandbox without one counts with."""
    default_cpu: str = ""
    default_storage: str = ""
    """The ephemeral-storage limit a sandbox without one counts with (the node's)."""
    recorded: Mapping[str, Recorded] = field(default_factory=dict)
    """A started sandbox's limits as its container records them (by key): what its
    start decided, its namespace's defaults included."""
    namespace_defaults: Mapping[str, DefaultLimits] = field(default_factory=dict)
    """Each waiting sandbox's namespace's default limits (by namespace; the agent's
    where the namespace names none), as last read."""
    classes: Mapping[str, RuntimeClassInfo] = field(default_factory=dict)
    """Each sandbox's RuntimeClass, by key (its overhead and placement count)."""
    class_refused: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """``{key: (reason, message)}``: its RuntimeClass cannot run here."""
    class_unreadable: Collection[str] = ()
    """Keys whose RuntimeClass could not be read this pass."""
    hold: str = ""
    """Why the node starts nothing new now ("" when it does): disk pressure."""


def usage(key: str, facts: StartFacts) -> Usage:
    """Its limits, else its namespace's defaults, else the agent's, plus its
    RuntimeClass's overhead; a started sandbox's limits as its container records them."""
    obj = facts.bodies.get(key) or {}
    limits = ((obj.get("spec") or {}).get("resources") or {}).get("limits") or {}
    created = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    ns = facts.namespace_defaults.get(split_key(key)[0]) or DefaultLimits()
    used = usage_of(
        key,
        limits.get("memory") or ns.memory or facts.default_memory,
        limits.get("cpu") or ns.cpu or facts.default_cpu,
        created,
        limits.get("ephemeralStorage") or ns.ephemeral_storage or facts.default_storage,
    )
    if (recorded := facts.recorded.get(key)) is not None:
        used = replace(
            used,
            memory=used.memory if recorded.memory is None else recorded.memory,
            cpu_millis=used.cpu_millis if recorded.cpu_millis is None else recorded.cpu_millis,
            storage=used.storage if recorded.storage is None else recorded.storage,
        )
    rc = facts.classes.get(key)
    if rc is None:
        return used
    return replace(
        used,
        memory=used.memory + rc.overhead_memory,
        cpu_millis=used.cpu_millis + rc.overhead_cpu_millis,
    )


def misplaced(starting: Sequence[str], facts: StartFacts) -> dict[str, str]:
    """``{key: message}`` of the sandboxes ``starting`` whose placement, joined with
    their RuntimeClass's, this node does not satisfy."""
    node_body = facts.node_body or {}
    labels = dict((node_body.get("metadata") or {}).get("labels") or {})
    taints = taints_of(node_body)
    refused = {}
    for key in starting:
        try:
            placement = Placement.from_body((facts.bodies.get(key) or {}).get("spec") or {})
        except ValueError as exc:
            refused[key] = f"its placement cannot be read: {exc}"
            continue
        if key in facts.classes:
            placement = joined_placement(placement, facts.classes[key])
        why = misfit(placement, labels, taints)
        if why is not None:
            refused[key] = (
                f"spec.nodeName is {facts.node}, which this sandbox may not run on: {why}"
            )
    return refused


def refused_starts(
    starting: Sequence[str], started: Sequence[str], facts: StartFacts
) -> dict[str, Refused]:
    """The refusals among ``starting`` (keys the plan would start, each in
    ``facts.bodies``), given the keys ``started`` that count as running."""
    failed = dict(facts.class_refused)
    for key, why in misplaced(starting, facts).items():
        failed.setdefault(key, (SandboxReason.PLACEMENT_REFUSED, why))
    refused = {
        key: Refused(Refusal.WAIT) if key in facts.class_unreadable else Refused(Refusal.FAIL, *rw)
        for key, rw in failed.items()
        if key in starting
    }
    waiting = [k for k in starting if k not in refused and k not in facts.class_unreadable]
    full = over_capacity(
        facts.node,
        [usage(k, facts) for k in started],
        [usage(k, facts) for k in waiting],
        facts.capacity,
    )
    for key, why in full.items():
        refused[key] = Refused(Refusal.FAIL, SandboxReason.OVER_CAPACITY, why)
    for key in starting:
        if key in refused:
            continue
        if facts.hold:
            refused[key] = Refused(Refusal.HOLD, SandboxReason.DISK_PRESSURE, facts.hold)
        elif key in facts.class_unreadable:
            refused[key] = Refused(Refusal.WAIT)
    return refused


__all__ = [
    "Refusal",
    "Refused",
    "StartFacts",
    "misplaced",
    "refused_starts",
    "usage",
]
