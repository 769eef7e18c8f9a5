"""A node's stream slots and the suspensions they exclude: pure decisions.

The agent admits at most ``limit`` streams at once. Each admitted exec, files or
port-forward connection holds a slot naming its sandbox from its admission to the
end of its connection, whatever ends it: that slot is also the sandbox's in-use
mark, which keeps it from idling and from being suspended. A suspension (asked
or idle) commits the sandbox's files and removes its container; a files write
landing after the commit read them would be acknowledged and lost. So the two
exclude each other on a sandbox, in one state changed under one lock: a
suspension begins only while no slot names its sandbox, and no stream into it is
admitted once it has begun, until it ends. A log needs no task and is never held
off.

An admission that waits for its sandbox (a restore after an idle suspension)
waits within the gateway's open timeout (``admission_wait``): past it the
gateway has given up, and nobody would read the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

ANSWER_ROOM = 3.0
"""Seconds of the gateway's open timeout kept for the TLS handshake before the
admission and the relay of its answer after it."""
MAX_ADMISSION_WAIT = 60.0
"""Seconds an admission waits for its sandbox at most, whatever the gateway says."""


class Admission(StrEnum):
    ADMITTED = "admitted"
    FULL = "full"
    """Every slot of the node is taken."""
    SUSPENDING = "suspending"
    """A suspension of the sandbox has begun: its files are being committed."""


@dataclass(frozen=True)
class StreamSlots:
    """The admitted connections, each with the sandbox it uses (None: a log), and
    the sandboxes whose suspension has begun."""

    limit: int
    """Streams the node admits at once."""
    used: Mapping[int, str | None] = field(default_factory=lambda: MappingProxyType({}))
    suspending: frozenset[str] = frozenset()

    def sessions(self, key: str) -> int:
        """Exec, files and port-forward connections into sandbox ``key``."""
        return sum(1 for used in self.used.values() if used == key)

    def in_use(self) -> frozenset[str]:
        """The sandboxes with an exec, files or port-forward connection."""
        return frozenset(used for used in self.used.values() if used)


def admit(slots: StreamSlots, connection: int, key: str | None) -> tuple[StreamSlots, Admission]:
    """Give ``connection`` a slot for sandbox ``key`` (None: a log), unless the node
    is full or the sandbox is being suspended."""
    if len(slots.used) >= slots.limit:
        return slots, Admission.FULL
    if key is not None and key in slots.suspending:
        return slots, Admission.SUSPENDING
    used = MappingProxyType({**slots.used, connection: key})
    return replace(slots, used=used), Admission.ADMITTED


def release(slots: StreamSlots, connection: int) -> tuple[StreamSlots, str | None]:
    """Free ``connection``'s slot (once: a second release finds none); the sandbox
    it used, None for a log or a slot already freed."""
    if connection not in slots.used:
        return slots, None
    used = dict(slots.used)
    key = used.pop(connection)
    return replace(slots, used=MappingProxyType(used)), key


def begin_suspension(slots: StreamSlots, key: str) -> tuple[StreamSlots, bool]:
    """Begin suspending ``key`` if no admitted stream uses it (nor does another
    suspension); from then on no stream into it is admitted."""
    if key in slots.suspending or key in slots.in_use():
        return slots, False
    return replace(slots, suspending=slots.suspending | {key}), True


def end_suspension(slots: StreamSlots, key: str) -> StreamSlots:
    """The suspension of ``key`` is over (committed and removed, or not done)."""
    return replace(slots, suspending=slots.suspending - {key})


def admission_wait(gateway_open_timeout: str | None, default: float) -> float:
    """Seconds an admission may wait for its sandbox: what is left of the gateway's
    open timeout (``gateway_open_timeout``, as its header says it; ``default``, the
    agent's own handshake timeout, when absent or unreadable) once the room for the
    handshake and the answer is kept, and never more than ``MAX_ADMISSION_WAIT``."""
    try:
        seconds = float(gateway_open_timeout) if gateway_open_timeout else default
    except ValueError:
        seconds = default
    if not seconds > 0:  # NaN, zero, negative: the agent's own
        seconds = default
    seconds = min(seconds, MAX_ADMISSION_WAIT + ANSWER_ROOM)
    return max(seconds / 2, seconds - ANSWER_ROOM)


__all__ = [
    "ANSWER_ROOM",
    "MAX_ADMISSION_WAIT",
    "Admission",
    "StreamSlots",
    "admission_wait",
    "admit",
    "begin_suspension",
    "end_suspension",
    "release",
]
