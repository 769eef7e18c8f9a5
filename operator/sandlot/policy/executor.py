"""The executor's wire format and the agent's decisions about it, as plain data.

The executor (``operator/executor``) runs inside a sandbox, so everything it says
is the tenant's to forge: every frame is checked against fixed bounds before its
payload is read, and a broken one ends the executor, never the agent. When the
executor cannot serve a command (the sandbox has none, it died, it broke the
protocol) the command goes through the runtime's exec as it always did; a dead
executor is started again at most after ``policy.backoff``'s capped doubling of
its consecutive deaths, so a tenant killing it in a loop costs the node one
runtime exec per back-off, not one per command.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from enum import Enum, StrEnum

from sandlot.policy.backoff import capped_doubling

HEADER = struct.Struct(">BII")  # kind, session, payload length
MAX_PAYLOAD = 64 * 1024  # bytes of one frame's payload, either way (the executor's bound too)
# Bytes of one output the executor sends ahead of the agent's acks, and of a command's
# stdin the agent sends ahead of the executor's.
WINDOW = 256 * 1024
MAX_SESSIONS = 1024  # sessions of one executor (the executor's bound too)
PROTOCOL = b"sandlot-exec 1"

# The agent's frames.
START, STDIN, CLOSE_STDIN, RESIZE, SIGNAL, RELEASE, ACK, PING = 1, 2, 3, 4, 5, 6, 7, 8
# The executor's.
READY, STARTED, FAILED, STDOUT, STDERR, EOF, EXIT, STDIN_ACK = 16, 17, 18, 19, 20, 21, 22, 23
FROM_EXECUTOR = frozenset({READY, STARTED, FAILED, STDOUT, STDERR, EOF, EXIT, STDIN_ACK})
# The fixed payload lengths of the executor's frames that have one.
FIXED_LENGTH = {STARTED: 4, EOF: 1, EXIT: 4, STDIN_ACK: 4}

FIRST_RESTART = 1.0  # seconds after an executor's first death before it is started again
RESTART_CAP = 60.0  # seconds: the longest wait between starts of one sandbox's executor
STABLE_FOR = 60.0  # seconds an executor must live for its death to count as the first again


class FrameError(ValueError):
    """A frame the executor may not send: the executor is ended for it."""


def encode(kind: int, session: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a payload of {len(payload)} bytes: more than {MAX_PAYLOAD}")
    return HEADER.pack(kind, session, len(payload)) + payload


def read_header(raw: bytes) -> tuple[int, int, int]:
    """(kind, session, length) of an executor's frame header, or ``FrameError``."""
    kind, session, length = HEADER.unpack(raw)
    if kind not in FROM_EXECUTOR:
        raise FrameError(f"a frame of unknown kind {kind}")
    if length > MAX_PAYLOAD:
        raise FrameError(f"a frame of {length} bytes: more than {MAX_PAYLOAD}")
    fixed = FIXED_LENGTH.get(kind)
    if fixed is not None and length != fixed:
        raise FrameError(f"a frame of kind {kind} with {length} bytes, not {fixed}")
    if (kind == READY) != (session == 0):
        raise FrameError(f"a frame of kind {kind} for session {session}")
    return kind, session, length


class Path(Enum):
    EXECUTOR = "executor"  # a request to the running executor
    START = "start"  # start the executor, then ask it
    RUNTIME = "runtime"  # the runtime's exec (a fallback, ``Choice.reason`` says why)


class Fallback(StrEnum):
    """Why a command went through the runtime's exec (``sandlot_exec_fallbacks_total``)."""

    ABSENT = "absent"  # the sandbox has no executor (its handler, or made before the node had it)
    BACKOFF = "backoff"  # its executor died and waits to be started again
    START_FAILED = "start_failed"  # starting its executor failed now
    BROKEN = "broken"  # its executor died or broke the protocol during the request


@dataclass(frozen=True)
class Choice:
    path: Path
    reason: Fallback | None = None


@dataclass(frozen=True)
class ExecutorRecord:
    """What the agent remembers of one sandbox's executor (monotonic seconds)."""

    deaths: int = 0  # consecutive deaths and failed starts
    last_death: float | None = None
    started: float | None = None  # when the running executor started


def choose_path(
    record: ExecutorRecord,
    now: float,
    *,
    mounted: bool,
    running: bool,
    first: float = FIRST_RESTART,
    cap: float = RESTART_CAP,
) -> Choice:
    """How a command reaches a sandbox whose executor is ``mounted`` (or not) and
    ``running`` (or not) at ``now``."""
    if not mounted:
        return Choice(Path.RUNTIME, Fallback.ABSENT)
    if running:
        return Choice(Path.EXECUTOR)
    if (
        record.deaths
        and record.last_death is not None
        and now < record.last_death + capped_doubling(record.deaths, first, cap)
    ):
        return Choice(Path.RUNTIME, Fallback.BACKOFF)
    return Choice(Path.START)


def started(record: ExecutorRecord, now: float) -> ExecutorRecord:
    return replace(record, started=now)


def died(record: ExecutorRecord, now: float, *, stable_for: float = STABLE_FOR) -> ExecutorRecord:
    """The record after the executor died (or failed to start) at ``now``: one that
    had lived ``stable_for`` seconds starts the count over."""
    lived = record.started is not None and now - record.started >= stable_for
    return ExecutorRecord(deaths=1 if lived else record.deaths + 1, last_death=now)


def forgettable(
    record: ExecutorRecord, now: float, *, cap: float = RESTART_CAP, stable_for: float = STABLE_FOR
) -> bool:
    """Whether a record with no running executor says nothing any more (its back-off
    and its stability window both passed): dropped, so records of sandboxes long
    gone do not pile up."""
    if record.last_death is None:
        return True
    return now - record.last_death >= max(cap, stable_for)


__all__ = [
    "ACK",
    "CLOSE_STDIN",
    "EOF",
    "EXIT",
    "FAILED",
    "HEADER",
    "MAX_PAYLOAD",
    "MAX_SESSIONS",
    "PING",
    "PROTOCOL",
    "READY",
    "RELEASE",
    "RESIZE",
    "SIGNAL",
    "START",
    "STARTED",
    "STDERR",
    "STDIN",
    "STDIN_ACK",
    "STDOUT",
    "WINDOW",
    "Choice",
    "ExecutorRecord",
    "Fallback",
    "FrameError",
    "Path",
    "choose_path",
    "died",
    "encode",
    "forgettable",
    "read_header",
    "started",
]
