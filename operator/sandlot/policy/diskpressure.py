"""The node's disk under pressure: which sandboxes to evict, and when: pure.

The agent measures the fuller of the filesystems holding containerd's root and the
sandboxes' logs. At or over the high watermark (after image GC had its turn) it
evicts sandboxes until the projected use is down to the low watermark, choosing
them as the kubelet's ``rankDiskPressureFunc`` does for ephemeral storage:

1. a sandbox over its own ``ephemeralStorage`` limit before one within it;
2. one using more than it requested before one within its request;
3. then by usage above the request, largest first.

Sandboxes carry no request today, so a request of 0 applies and the order is
"over its limit, then largest first"; the field is kept so the ranking stays the
kubelet's when requests come. Bytes already being freed (the writable layers of
sandboxes whose task has exited, which a teardown or the sweep removes) count
before anyone else is chosen, so a quiet neighbour is not evicted for what a stop
in flight will give back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sandlot.policy.ephemeralstorage import human_bytes


@dataclass(frozen=True)
class FsUse:
    """One filesystem's use, as ``statvfs`` gives it."""

    used: int
    """Bytes in use."""
    capacity: int
    """Bytes in all (used + available to an unprivileged writer)."""

    @property
    def fraction(self) -> float:
        return self.used / self.capacity if self.capacity > 0 else 0.0


@dataclass(frozen=True)
class Candidate:
    """A live sandbox the agent may evict."""

    key: str
    """``namespace/name``."""
    usage: int
    """Its writable layer and logs, in bytes (as ``policy.ephemeralstorage`` counts)."""
    limit: int | None = None
    """Its ``ephemeralStorage`` limit in bytes; None without one."""
    request: int = 0
    """Its ``ephemeralStorage`` request in bytes (0: none)."""


@dataclass(frozen=True)
class Eviction:
    key: str
    message: str
    """Names the resource, the node's use and the sandbox's use."""


@dataclass(frozen=True)
class PressureDecision:
    pressure: bool
    """The node is at or over its high watermark."""
    evict: tuple[Eviction, ...] = ()
    to_free: int = 0
    """Bytes to free to reach the low watermark, after what is already being freed."""


def fuller(uses: Iterable[FsUse]) -> FsUse:
    """The fullest of ``uses`` (by fraction); a zero-sized one when there is none."""
    return max(uses, key=lambda u: u.fraction, default=FsUse(0, 0))


def _check_watermarks(high: float, low: float) -> None:
    if not 0 < low <= high <= 1:
        raise ValueError(
            f"disk watermarks must satisfy 0 < low <= high <= 1, got low={low}, high={high}"
        )


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """``candidates`` in the kubelet's eviction order for disk pressure."""

    def order(c: Candidate) -> tuple[bool, bool, int, str]:
        over_limit = c.limit is not None and c.usage > c.limit
        over_request = c.usage > c.request
        return (not over_limit, not over_request, -(c.usage - c.request), c.key)

    return sorted(candidates, key=order)


def decide_pressure(
    use: FsUse,
    high: float,
    low: float,
    candidates: Iterable[Candidate],
    freeing: int = 0,
) -> PressureDecision:
    """Under pressure when ``use`` is at or over ``high`` (a fraction of capacity):
    evict in rank order until the sandboxes chosen, with the ``freeing`` bytes of
    stops in flight, bring use down to ``low``. Not under pressure: evict nobody."""
    _check_watermarks(high, low)
    if use.capacity <= 0 or use.fraction < high:
        return PressureDecision(pressure=False)
    to_free = max(use.used - int(low * use.capacity) - max(freeing, 0), 0)
    chosen: list[Eviction] = []
    remaining = to_free
    node = (
        f"the node's disk is {use.fraction:.0%} full ({human_bytes(use.used)} of "
        f"{human_bytes(use.capacity)}, high watermark {high:.0%})"
    )
    for c in rank(candidates):
        if remaining <= 0:
            break
        if c.usage <= 0:
            continue  # evicting it frees nothing
        limit = f", limit {human_bytes(c.limit)}" if c.limit is not None else ""
        chosen.append(
            Eviction(
                key=c.key,
                message=f"evicted for ephemeral-storage: {node}; this sandbox used "
                f"{human_bytes(c.usage)} (writable layer and logs{limit})",
            )
        )
        remaining -= c.usage
    return PressureDecision(pressure=True, evict=tuple(chosen), to_free=to_free)


UNMEASURED_HOLD = 5.0
"""Seconds a pass may evict nobody because a sandbox's layer could not be measured."""


def unmeasured_holds(now: float, unmeasured_since: float | None, hold: float) -> bool:
    """Nobody is evicted while a sandbox on the node could not be measured (containerd
    did not name its layer in time), for at most ``hold`` seconds from the first such
    pass: without its figure the projection would choose the next in rank, a quiet
    neighbour perhaps, for bytes the unmeasured one holds. After ``hold`` the pass
    goes on with what it knows, so a container containerd never names cannot keep
    the disk full for good."""
    return unmeasured_since is not None and now - unmeasured_since < hold


def pressure_holds(now: float, last_over: float | None, transition: float) -> bool:
    """The node reports disk pressure while it was over its high watermark less than
    ``transition`` seconds ago (the kubelet's ``evictionPressureTransitionPeriod``),
    so a node hovering at the mark does not flap."""
    return last_over is not None and now - last_over < transition


__all__ = [
    "UNMEASURED_HOLD",
    "Candidate",
    "Eviction",
    "FsUse",
    "PressureDecision",
    "decide_pressure",
    "fuller",
    "pressure_holds",
    "rank",
    "unmeasured_holds",
]
