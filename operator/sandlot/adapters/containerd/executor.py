"""One sandbox's executor (``operator/executor``), reached over the stdio of the
runtime exec that started it.

The executor is started once, through ``Execs.start`` with the container's own
process spec and only the arguments replaced, so it has exactly what any exec
of the sandbox has; each command is then a session on its stdin and stdout
(``policy.executor`` frames). The executor runs in the tenant's sandbox and is
trusted with nothing: frames are bounded before they are read, an output beyond
its window, a second start answer or an unknown kind ends it, every write to it
has a deadline, and a start it does not answer in time ends it too. A dead
executor ends its sessions with ``ExecutorGone``; its caller runs the next command
through the runtime's exec.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import struct
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sandlot.adapters.containerd.execs import ExecProcess, Execs, exec_process_spec
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout
from sandlot.policy.executor import (
    ACK,
    CLOSE_STDIN,
    EOF,
    EXIT,
    FAILED,
    HEADER,
    MAX_PAYLOAD,
    MAX_SESSIONS,
    PING,
    PROTOCOL,
    READY,
    RELEASE,
    RESIZE,
    SIGNAL,
    START,
    STARTED,
    STDERR,
    STDIN,
    STDIN_ACK,
    STDOUT,
    WINDOW,
    FrameError,
    encode,
    read_header,
)
from sandlot.policy.ocispec import EXECUTOR

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
STDIN_WAIT = 0.5  # seconds between looks at whether a command that reads no stdin ended
WHY_MAX = 1024  # bytes of a start refusal kept


class ExecutorGone(RuntimeError_):
    """The executor ended or broke the protocol: the command goes the runtime's way."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="executor_gone")


class ExecutorProcess:
    """One command the executor runs: its outputs, stdin, exit and signals."""

    def __init__(self, channel: ExecutorChannel, session: int, *, tty: bool, stdin: bool) -> None:
        self.channel = channel
        self.session = session
        self.container_id = channel.container_id
        self.exec_id = f"{channel.exec_id}/{session}"
        self.tty = tty
        self.takes_stdin = stdin
        self.pid = 0
        self.refusal: str | None = None
        self.answered = threading.Event()
        self._names = ("stdout",) if tty else ("stdout", "stderr")
        self._queues: dict[str, queue.Queue[bytes | None]] = {n: queue.Queue() for n in self._names}
        self._unacked = dict.fromkeys(self._names, 0)
        self._count_lock = threading.Lock()  # the reader adds, the caller's pump takes
        self._code: int | None = None
        self._gone: str | None = None
        self._exited = threading.Event()
        self._stdin_closed = False
        self._stdin_unacked = 0  # bytes sent, not yet handed to the command
        self._stdin_room = threading.Condition()

    # -- the agent's side ---------------------------------------------------------

    def outputs(self) -> tuple[str, ...]:
        return self._names

    def read(self, name: str) -> bytes:
        """The next output of ``name``; b"" at its end. What is taken is acknowledged,
        so the executor sends more."""
        data = self._queues[name].get()
        if not data:
            self._queues[name].put(None)  # every later read ends too
            return b""
        with self._count_lock:
            self._unacked[name] -= len(data)
        with contextlib.suppress(ExecutorGone):
            stream = 1 if name == "stdout" else 2
            self.channel.send(ACK, self.session, struct.pack(">BI", stream, len(data)))
        return data

    def write_stdin(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin, at most ``WINDOW`` bytes ahead of what
        the executor handed it: the caller waits, as on a full FIFO, while the command
        does not read; data for a command that ended is dropped."""
        if not self.takes_stdin or self._stdin_closed:
            return
        for at in range(0, len(data), MAX_PAYLOAD):
            piece = data[at : at + MAX_PAYLOAD]
            with self._stdin_room:
                while self._stdin_unacked + len(piece) > WINDOW:
                    if self._exited.is_set():
                        return
                    self._stdin_room.wait(STDIN_WAIT)
                self._stdin_unacked += len(piece)
            self.channel.send(STDIN, self.session, piece)

    def close_stdin(self) -> None:
        self._stdin_closed = True
        self.channel.send(CLOSE_STDIN, self.session)

    def resize(self, width: int, height: int) -> None:
        self.channel.send(RESIZE, self.session, struct.pack(">HH", width, height))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """``sig`` to the command's process group."""
        self.channel.send(SIGNAL, self.session, struct.pack(">I", sig))

    def wait(self, timeout: float) -> int:
        if not self._exited.wait(timeout):
            raise RuntimeTimeout(f"{self.exec_id} has not exited within {timeout:g}s")
        if self._code is None:
            raise ExecutorGone(f"the executor in {self.container_id} {self._gone}")
        return self._code

    def release(self) -> None:
        """The session is over: its process group is killed, its outputs end."""
        self.channel.forget(self)
        with contextlib.suppress(ExecutorGone):
            self.channel.send(RELEASE, self.session)
        self._end_outputs()

    # -- the executor's side (its reader thread) ----------------------------------

    def _output(self, name: str, data: bytes) -> None:
        if name not in self._queues:
            raise FrameError(f"output on {name} of a terminal session")
        with self._count_lock:
            if self._unacked[name] + len(data) > WINDOW:
                raise FrameError(f"more than {WINDOW} bytes of {name} not acknowledged")
            self._unacked[name] += len(data)
        if data:
            self._queues[name].put(data)

    def _stdin_taken(self, count: int) -> None:
        with self._stdin_room:
            if count > self._stdin_unacked:
                raise FrameError(f"{count} bytes of stdin acknowledged, {self._stdin_unacked} sent")
            self._stdin_unacked -= count
            self._stdin_room.notify_all()

    def _exit(self, code: int) -> None:
        if self._exited.is_set():
            raise FrameError(f"a second exit of session {self.session}")
        if code > 255:
            raise FrameError(f"an exit code of {code}")
        self._code = code
        self._exited.set()
        with self._stdin_room:
            self._stdin_room.notify_all()

    def _lost(self, why: str) -> None:
        self._gone = why
        self.answered.set()
        self._exited.set()
        self._end_outputs()

    def _end_outputs(self) -> None:
        for q in self._queues.values():
            q.put(None)


class ExecutorChannel:
    """The executor of ``container_id``, started by ``start()``; ``open()`` runs a command."""

    def __init__(
        self, execs: Execs, container_id: str, *, call_timeout: float, quiet: float
    ) -> None:
        self.execs = execs
        self.container_id = container_id
        self.call_timeout = call_timeout
        self.quiet = quiet
        self.exec_id = f"sandlot-exec-{uuid.uuid4().hex[:12]}"
        self.dead: str | None = None
        self.died_at: float | None = None
        self._base: dict[str, Any] = {}
        self._process: ExecProcess | None = None
        self._sessions: dict[int, ExecutorProcess] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._next = 0
        self._ready = threading.Event()

    @property
    def running(self) -> bool:
        return self.dead is None

    def start(self, container_spec: dict[str, Any]) -> None:
        """Start the executor as any exec of the container starts and wait (bounded)
        for its hello; ``RuntimeError_`` when it does not come."""
        self._base = container_spec
        args = [EXECUTOR, str(max(1, int(self.quiet)))]
        self._process = self.execs.start(
            self.container_id, self.exec_id, args, tty=False, stdin=True, timeout=self.call_timeout
        )
        assert self._process.stdin is not None, "started with stdin"
        os.set_blocking(self._process.stdin, False)  # every write has a deadline
        threading.Thread(
            target=self._read, name=f"executor {self.container_id}", daemon=True
        ).start()
        if not self._ready.wait(self.call_timeout) or self.dead is not None:
            self.lose(self.dead or f"did not say hello within {self.call_timeout:g}s")
            raise ExecutorGone(f"the executor in {self.container_id} {self.dead}")

    def open(self, args: Sequence[str], *, tty: bool, stdin: bool) -> ExecutorProcess:
        """Run ``args`` as a runtime exec of the container would (its environment and
        working directory, ``TERM`` for a terminal); ``RuntimeError_`` with the
        executor's reason when it cannot, ``ExecutorGone`` when the executor is."""
        spec = exec_process_spec(self._base, args, tty)
        request = {
            "argv": list(args),
            "env": list(spec.get("env") or []),
            "cwd": spec.get("cwd") or "/",
            "tty": tty,
            "stdin": stdin,
        }
        with self._lock:
            if self.dead is not None:
                raise ExecutorGone(f"the executor in {self.container_id} {self.dead}")
            if len(self._sessions) >= MAX_SESSIONS:
                raise ExecutorGone(f"{MAX_SESSIONS} commands are running through the executor")
            self._next += 1
            process = ExecutorProcess(self, self._next, tty=tty, stdin=stdin)
            self._sessions[process.session] = process
        self.send(START, process.session, json.dumps(request).encode())
        if not process.answered.wait(self.call_timeout):
            self.lose(f"did not answer a start within {self.call_timeout:g}s")
        if self.dead is not None or (process.refusal is None and not process.pid):
            self.forget(process)
            raise ExecutorGone(f"the executor in {self.container_id} {self.dead}")
        if process.refusal is not None:
            self.forget(process)
            raise RuntimeError_(process.refusal, code="refused")
        return process

    def send(self, kind: int, session: int, payload: bytes = b"") -> None:
        """One frame to the executor, written within ``call_timeout`` or the executor
        is ended: one that stops reading never holds a caller."""
        if self.dead is not None or self._process is None or self._process.stdin is None:
            raise ExecutorGone(f"the executor in {self.container_id} {self.dead}")
        frame = memoryview(encode(kind, session, payload))
        deadline = time.monotonic() + self.call_timeout
        with self._send_lock:
            while frame:
                try:
                    written = os.write(self._process.stdin, frame)
                    frame = frame[written:]
                    continue
                except BlockingIOError:
                    pass
                except OSError as e:
                    self.lose(f"cannot be written to: {e}")
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [self._process.stdin], [], left)[1]:
                    self.lose(f"read nothing for {self.call_timeout:g}s")
                    break
        if frame:
            raise ExecutorGone(f"the executor in {self.container_id} {self.dead}")

    def ping(self) -> None:
        with contextlib.suppress(ExecutorGone):
            self.send(PING, 0)

    def forget(self, process: ExecutorProcess) -> None:
        with self._lock:
            self._sessions.pop(process.session, None)

    def lose(self, why: str) -> None:
        """The executor is of no more use: its sessions end, it is killed."""
        with self._lock:
            if self.dead is not None:
                return
            self.dead, self.died_at = why, time.monotonic()
            sessions, self._sessions = list(self._sessions.values()), {}
        log.warning(
            "the executor in %s %s; commands go through the runtime", self.container_id, why
        )
        for process in sessions:
            process._lost(why)
        if self._process is not None:
            with contextlib.suppress(RuntimeError_, ValueError):
                self.execs.kill(self._process, timeout=self.call_timeout)

    def close(self) -> None:
        self.lose("was closed")

    # -- the reader thread ----------------------------------------------------------

    def _read(self) -> None:
        assert self._process is not None
        fd = self._process.stdout
        buffer = bytearray()

        def take(n: int) -> bytes:
            while len(buffer) < n:
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    raise EOFError
                buffer.extend(chunk)
            out = bytes(buffer[:n])
            del buffer[:n]
            return out

        try:
            while True:
                kind, session, length = read_header(take(HEADER.size))
                self._dispatch(kind, session, take(length))
        except FrameError as e:
            self.lose(f"broke the protocol ({e})")
        except (EOFError, OSError):
            self.lose("ended")
        finally:
            self._ready.set()
            self._cleanup()

    def _dispatch(self, kind: int, session: int, payload: bytes) -> None:
        if kind == READY:
            if self._ready.is_set() or payload != PROTOCOL:
                raise FrameError(f"a hello of {payload[:64]!r}")
            self._ready.set()
            return
        if not self._ready.is_set():
            raise FrameError("a frame before its hello")
        with self._lock:
            process = self._sessions.get(session)
        if process is None:
            return  # a session released meanwhile: what is left of it goes nowhere
        if kind in (STARTED, FAILED):
            if process.answered.is_set():
                raise FrameError(f"a second start answer for session {session}")
            if kind == STARTED:
                process.pid = struct.unpack(">I", payload)[0] or 1
            else:
                process.refusal = payload[:WHY_MAX].decode(errors="replace") or "refused"
            process.answered.set()
        elif not process.answered.is_set():
            raise FrameError(f"a frame of kind {kind} before session {session} started")
        elif kind in (STDOUT, STDERR):
            process._output("stdout" if kind == STDOUT else "stderr", payload)
        elif kind == EOF:
            name = {1: "stdout", 2: "stderr"}.get(payload[0])
            if name is None or name not in process.outputs():
                raise FrameError(f"the end of output {payload[0]}")
            process._queues[name].put(None)
        elif kind == EXIT:
            process._exit(struct.unpack(">I", payload)[0])
        elif kind == STDIN_ACK:
            process._stdin_taken(struct.unpack(">I", payload)[0])

    def _cleanup(self) -> None:
        process = self._process
        if process is None:
            return
        # ValueError: the agent stopping closed the connection first; the shim ends
        # the executor with the task or when its stdin is gone, and it ends itself
        # when no ping comes.
        with contextlib.suppress(RuntimeError_, ValueError):
            self.execs.kill(process, timeout=self.call_timeout)
        with contextlib.suppress(RuntimeError_, ValueError):
            self.execs.wait(process, timeout=self.call_timeout)
        said = b""
        if process.stderr is not None:
            os.set_blocking(process.stderr, False)
            with contextlib.suppress(OSError):
                said = os.read(process.stderr, WHY_MAX)
        if said:
            log.info(
                "the executor in %s said: %s", self.container_id, said.decode(errors="replace")
            )
        process.release()
        with contextlib.suppress(RuntimeError_, ValueError):
            self.execs.delete(self.container_id, self.exec_id, timeout=self.call_timeout)


__all__ = ["ExecutorChannel", "ExecutorGone", "ExecutorProcess"]
