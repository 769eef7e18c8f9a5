"""A sandbox's disk use against its ``ephemeralStorage`` limit: pure.

Measured as the kubelet measures a container's ephemeral storage: the allocated
blocks of its writable layer (what it wrote to its root filesystem) and of its log
files, so a sparse file counts what it holds, not what it claims. The limit a
container runs with is decided when it starts (``with_defaults``) and kept on it
as a label, like the memory limit in its cgroup: a namespace default changed later
applies to the next start.

A walk that stopped at its cap of entries counts as over the limit: its use is
then unknown, and a tenant must not make itself unmeasurable by making files. The
cap is far beyond what a writable layer holds in practice (the image's own files
are in the read-only layers below it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sandlot.api.keys import EPHEMERAL_STORAGE_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.quantity import memory_bytes

MAX_ENTRIES = 200_000
"""Most files and directories one measurement visits (for one sandbox, one pass)."""


@dataclass(frozen=True)
class DiskUse:
    """What a measurement found."""

    bytes: int
    """Allocated bytes (``st_blocks * 512``), each inode counted once."""
    entries: int
    """Files and directories visited."""
    complete: bool = True
    """False when the walk stopped at its cap of entries: ``bytes`` is a lower bound."""


@dataclass(frozen=True)
class StorageDecision:
    stop: bool
    message: str = ""
    """Why it stops, naming its use and its limit ("" when it keeps running)."""


KEEP = StorageDecision(stop=False)


def human_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1 (``32.0Mi``)."""
    if n < 1024:
        return str(n)
    value = n / 1024
    for unit in ("Ki", "Mi", "Gi", "Ti"):
        if value < 1024 or unit == "Ti":
            break
        value /= 1024
    return f"{value:.1f}{unit}"


def decide_storage(use: DiskUse, limit: int) -> StorageDecision:
    """Stop a sandbox whose writable layer and logs hold more than ``limit`` bytes,
    or more entries than one walk visits; keep it otherwise."""
    if not use.complete:
        return StorageDecision(
            stop=True,
            message=f"ephemeral storage not measurable: more than {use.entries} files and "
            f"directories in its writable layer (at least {human_bytes(use.bytes)}), over "
            f"what one pass counts; its limit is {human_bytes(limit)}",
        )
    if use.bytes > limit:
        return StorageDecision(
            stop=True,
            message=f"ephemeral storage {human_bytes(use.bytes)} ({use.bytes} bytes, writable "
            f"layer and logs) is over its limit of {human_bytes(limit)} ({limit} bytes)",
        )
    return KEEP


WRITE_CAP_MARGIN = 4 * 2**20
"""Bytes a filesystem cap on a writable layer sits above the sandbox's limit: a
writer held at the cap is seen over its limit by the next measurement and stopped
as any other (the cap only ends the overshoot), whatever the filesystem's own
accounting leaves unused of the last extent."""


def write_cap(limit: int) -> int:
    """The most bytes a sandbox limited to ``limit`` may write to its layer at all."""
    return limit + WRITE_CAP_MARGIN


MIN_CHECK = 0.25
"""Seconds: the soonest a growing sandbox is measured again."""


@dataclass(frozen=True)
class Sample:
    """One measurement of a sandbox: its bytes at a time (seconds, any clock)."""

    bytes: int
    at: float


def next_check(previous: Sample | None, current: Sample, limit: int, interval: float) -> float:
    """Seconds until a sandbox is measured again: the pass's ``interval``, or half the
    projected time to ``limit`` at the rate seen between the two samples when that
    is sooner (never under ``MIN_CHECK``), so a writer is caught near its limit
    rather than a whole interval past it. A sandbox not growing waits the interval."""
    if interval <= 0:
        raise ValueError(f"the storage interval must be positive, got {interval}")
    if previous is None or current.at <= previous.at or current.bytes <= previous.bytes:
        return interval
    rate = (current.bytes - previous.bytes) / (current.at - previous.at)
    to_limit = max(limit - current.bytes, 0) / rate
    return min(interval, max(to_limit / 2, MIN_CHECK))


def limit_labels(spec: SandboxSpec) -> dict[str, str]:
    """The container label carrying ``spec``'s disk limit in bytes (none without one)."""
    limit = spec.resources.limits.ephemeral_storage if spec.resources else None
    return {EPHEMERAL_STORAGE_LABEL: str(memory_bytes(limit))} if limit else {}


def limit_of(labels: Mapping[str, str]) -> int | None:
    """The disk limit a container's labels carry; None when it has none (or a value
    that is no byte count: a label written by something else)."""
    text = labels.get(EPHEMERAL_STORAGE_LABEL, "")
    return int(text) if text.isdigit() and int(text) > 0 else None


__all__ = [
    "KEEP",
    "MAX_ENTRIES",
    "MIN_CHECK",
    "WRITE_CAP_MARGIN",
    "DiskUse",
    "Sample",
    "StorageDecision",
    "decide_storage",
    "human_bytes",
    "limit_labels",
    "limit_of",
    "next_check",
    "write_cap",
]
