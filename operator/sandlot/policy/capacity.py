"""Which of a node's waiting sandboxes would take it beyond its capacity: pure.

The scheduler places by free slots, but a Sandbox may arrive with ``spec.nodeName``
set by hand, bypassing it; the agent is the last line. A node's capacity has four
dimensions: sandboxes, memory, CPU and ephemeral storage (the sum of the
sandboxes' limits, each sandbox counted with its own limits or the agent's
defaults; a started one's disk limit as its container records it, its namespace's
default included). Sandboxes that run
already (or whose container exists) are counted first; the waiting ones are
admitted oldest first, each only if it fits beside everything admitted before it.
The others are refused with a reason naming the full dimension.

Memory capacity defaults to the node's own memory when the agent's settings leave
it empty; CPU, compressible, is bounded only when configured. Ephemeral storage
defaults to the room below the image collector's high watermark on the filesystem
holding containerd's root (``storage_room``): the collector keeps images and
everything else under that mark, as the kubelet's allocatable ephemeral storage
is its capacity less the eviction threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sandlot.api.keys import CPU_LIMIT_LABEL, EPHEMERAL_STORAGE_LABEL, MEMORY_LIMIT_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.quantity import memory_bytes, parse_quantity


@dataclass(frozen=True)
class Capacity:
    sandboxes: int
    memory: int | None = None
    """Bytes; None: not limited."""
    cpu_millis: int | None = None
    """Thousandths of a CPU; None: not limited."""
    storage: int | None = None
    """Bytes of ephemeral storage (writable layers and logs); None: not limited."""


@dataclass(frozen=True)
class Usage:
    key: str
    memory: int
    """Bytes of its memory limit (0: none)."""
    cpu_millis: int
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339 sorts as text)."""
    storage: int = 0
    """Bytes of its ephemeral-storage limit (0: none)."""


@dataclass(frozen=True)
class Recorded:
    """A started sandbox's limits as its container's labels record them (None: not
    recorded, as on a container started before they were)."""

    memory: int | None = None
    cpu_millis: int | None = None
    storage: int | None = None


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and int(text) > 0 else None


def recorded_limits(labels: Mapping[str, str]) -> Recorded:
    """What a container's labels record of its sandbox's limits (a value that is no
    count, a label written by something else, is not recorded)."""
    return Recorded(
        _count(labels.get(MEMORY_LIMIT_LABEL)),
        _count(labels.get(CPU_LIMIT_LABEL)),
        _count(labels.get(EPHEMERAL_STORAGE_LABEL)),
    )


def capacity_labels(spec: SandboxSpec) -> dict[str, str]:
    """The labels recording a start's memory and CPU limits (``spec`` with its
    defaults filled) for the capacity judgement of the passes after it."""
    limits = spec.resources.limits if spec.resources else None
    labels = {}
    if limits is not None and limits.memory:
        labels[MEMORY_LIMIT_LABEL] = str(memory_bytes(limits.memory))
    if limits is not None and limits.cpu:
        labels[CPU_LIMIT_LABEL] = str(cpu_millis(limits.cpu))
    return labels


def storage_room(filesystem_bytes: int, high_percent: float) -> int:
    """The ephemeral storage a node admits by default: its filesystem below the image
    collector's high watermark."""
    return int(filesystem_bytes * high_percent / 100)


def cpu_millis(text: str) -> int:
    return int(parse_quantity(text) * 1000) if text else 0


def usage_of(key: str, memory: str, cpu: str, created: str = "", storage: str = "") -> Usage:
    return Usage(
        key,
        memory_bytes(memory) if memory else 0,
        cpu_millis(cpu),
        created,
        memory_bytes(storage) if storage else 0,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}Gi"


def over_capacity(
    node: str, started: Sequence[Usage], waiting: Sequence[Usage], capacity: Capacity
) -> dict[str, str]:
    """``{key: message}`` for each waiting sandbox that does not fit."""
    count = len(started)
    memory = sum(u.memory for u in started)
    cpu = sum(u.cpu_millis for u in started)
    storage = sum(u.storage for u in started)
    refused: dict[str, str] = {}
    for u in sorted(waiting, key=lambda u: (u.created, u.key)):
        if count + 1 > capacity.sandboxes:
            why = f"{count} sandboxes run or start there (capacity {capacity.sandboxes})"
        elif capacity.memory is not None and memory + u.memory > capacity.memory:
            why = (
                f"its memory limit {_gib(u.memory)} does not fit: {_gib(memory)} of "
                f"{_gib(capacity.memory)} taken"
            )
        elif capacity.cpu_millis is not None and cpu + u.cpu_millis > capacity.cpu_millis:
            why = (
                f"its CPU limit {u.cpu_millis}m does not fit: {cpu}m of "
                f"{capacity.cpu_millis}m taken"
            )
        elif capacity.storage is not None and storage + u.storage > capacity.storage:
            why = (
                f"its ephemeral-storage limit {_gib(u.storage)} does not fit: "
                f"{_gib(storage)} of {_gib(capacity.storage)} taken"
            )
        else:
            count, memory, cpu = count + 1, memory + u.memory, cpu + u.cpu_millis
            storage += u.storage
            continue
        refused[u.key] = f"node {node} is full: {why}"
    return refused


__all__ = [
    "Capacity",
    "Recorded",
    "Usage",
    "capacity_labels",
    "cpu_millis",
    "over_capacity",
    "recorded_limits",
    "storage_room",
    "usage_of",
]
