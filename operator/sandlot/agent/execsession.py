"""``sandlot exec``: one command in a sandbox's container, over one connection.

Three threads per session, none of them unbounded: the caller's thread waits for
the exit (one ``Tasks.Wait`` of ``WAIT_SLICE`` at a time, so a client that left
or an agent that stops is noticed between them, and the process killed), one
reader takes the client's frames (stdin, resize, close of stdin) and one pump
per output FIFO sends stdout and stderr. After the exit the pumps drain to EOF
(the shim closes its ends once it copied everything), then the exit status goes
on the status channel and the connection closes; the exec's process record and
FIFOs are removed whatever happened. A session in which neither direction carried
anything (no client frame, no output) for ``idle`` seconds is killed like one the
client left, and its status says so: a forgotten ``exec -it`` holds a thread and a
place among the node's streams only that long.

The command runs through the sandbox's executor when ``executors`` is given and
the sandbox has one (``agent.executors``), else through the runtime's exec: the
session is the same either way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from sandlot.adapters.containerd.execs import Execs
from sandlot.adapters.containerd.executor import ExecutorGone
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout
from sandlot.agent.executors import Command, Executors, runtime_start
from sandlot.policy.streams import (
    CLOSE,
    RESIZE,
    STATUS,
    STDERR,
    STDIN,
    STDOUT,
    StreamRequest,
    decode_frame,
    encode_frame,
    error_status,
    exit_status,
    parse_resize,
)

log = logging.getLogger(__name__)

WAIT_SLICE = 1.0  # seconds of one Tasks.Wait before looking at the client and the agent
DRAIN_WAIT = 5.0  # seconds the output pumps get to reach EOF after the exit
RECV_WAIT = 0.5


def idle_past(last_activity: float, now: float, idle: float) -> bool:
    """Whether a stream whose data last moved at ``last_activity`` has been quiet for
    ``idle`` seconds at ``now`` (both ``time.monotonic()`` readings)."""
    return now - last_activity >= idle


@dataclass(eq=False)
class ExecSession:
    """Runs ``request`` in ``container_id`` for ``connection`` (a websockets sync
    server connection). ``run()`` returns when the command and the stream ended."""

    connection: Any
    execs: Execs
    container_id: str
    request: StreamRequest
    _: KW_ONLY
    call_timeout: float
    stopping: Callable[[], bool]
    idle: float
    executors: Executors | None = None
    _send_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _gone: threading.Event = field(default_factory=threading.Event, init=False)
    # A float store: atomic, any thread may.
    _last_activity: float = field(default_factory=time.monotonic, init=False)
    _timed_out: bool = field(default=False, init=False)
    _broken: str | None = field(default=None, init=False)
    """Why the command had to be ended, if it had."""

    def send(self, message: bytes) -> None:
        with self._send_lock:
            self.connection.send(message)

    def run(self) -> None:
        exec_id = f"exec-{uuid.uuid4().hex[:12]}"
        start = self.executors.start if self.executors is not None else self._runtime_start
        try:
            process = start(
                self.container_id,
                exec_id,
                self.request.command,
                tty=self.request.tty,
                stdin=self.request.stdin,
                timeout=self.call_timeout,
            )
        except RuntimeError_ as exc:
            self._finish(error_status(f"cannot run {self.request.command[0]!r}: {exc}"))
            return
        try:
            self._serve(process)
        finally:
            process.release()

    def _runtime_start(self, container_id: str, exec_id: str, args: Any, **how: Any) -> Command:
        return runtime_start(self.execs, container_id, exec_id, args, **how)

    def _serve(self, process: Command) -> None:
        pumps = [
            threading.Thread(target=self._pump, args=(process, name, channel), daemon=True)
            for name, channel in (("stdout", STDOUT), ("stderr", STDERR))
            if name in process.outputs()
        ]
        reader = threading.Thread(target=self._read_client, args=(process,), daemon=True)
        for thread in (*pumps, reader):
            thread.start()
        began = time.monotonic()
        code = self._wait_exit(process)
        exited = time.monotonic()
        for pump in pumps:
            pump.join(DRAIN_WAIT)
        log.info(
            "exec %s in %s: exit %s after %.2fs, output drained in %.2fs",
            process.exec_id,
            self.container_id,
            code,
            exited - began,
            time.monotonic() - exited,
        )
        if code is None and self._timed_out:
            quiet = f"no input or output for {self.idle:g}s: the exec session timed out"
            self._finish(error_status(quiet, 408))
        elif code is None and self._broken:
            self._finish(error_status(f"the command was ended: {self._broken}"))
        elif code is None:
            self._finish(error_status("the command was ended: the client or the agent went away"))
        else:
            self._finish(exit_status(code))

    def _wait_exit(self, process: Command) -> int | None:
        """The exit code; None when the client left, the agent stops or the session
        was idle for ``idle`` seconds first (killed then)."""
        while True:
            try:
                return process.wait(WAIT_SLICE)
            except RuntimeTimeout:
                pass
            except ExecutorGone as exc:
                log.warning("exec %s in %s: %s", process.exec_id, self.container_id, exc)
                self._broken = str(exc)
                return None
            except RuntimeError_ as exc:
                log.warning(
                    "exec %s in %s: wait failed: %s", process.exec_id, self.container_id, exc
                )
                return None
            if idle_past(self._last_activity, time.monotonic(), self.idle):
                log.info(
                    "exec %s in %s: nothing moved for %gs, ending it",
                    process.exec_id,
                    self.container_id,
                    self.idle,
                )
                self._timed_out = True
            if self._timed_out or self._broken or self._gone.is_set() or self.stopping():
                with contextlib.suppress(RuntimeError_):
                    process.kill()
                with contextlib.suppress(RuntimeError_):
                    process.wait(self.call_timeout)
                return None

    def _pump(self, process: Command, name: str, channel: int) -> None:
        try:
            while data := process.read(name):
                self._last_activity = time.monotonic()
                self.send(encode_frame(channel, data))
        except Exception as exc:  # a closed connection or FIFO ends the pump either way
            log.debug("exec output pump %d ended: %s", channel, exc)

    def _read_client(self, process: Command) -> None:
        try:
            while True:
                try:
                    message = self.connection.recv(timeout=RECV_WAIT)
                except TimeoutError:
                    continue
                self._last_activity = time.monotonic()
                if isinstance(message, str):
                    message = message.encode()
                try:
                    self._on_frame(process, *decode_frame(message))
                except (ValueError, RuntimeError_) as exc:  # one bad frame, not the session
                    log.info("exec %s: frame refused: %s", process.exec_id, exc)
        except Exception as exc:  # ConnectionClosed or a broken frame: the client is done
            log.debug("exec %s: client stream ended: %s", process.exec_id, exc)
        finally:
            self._gone.set()

    def _on_frame(self, process: Command, channel: int, data: bytes) -> None:
        if channel == STDIN:
            process.write_stdin(data)
        elif channel == RESIZE and self.request.tty:
            width, height = parse_resize(data)
            process.resize(width, height)
        elif channel == CLOSE and data[:1] == bytes([STDIN]) and process.takes_stdin:
            try:
                process.close_stdin()
            except RuntimeError_ as exc:
                # It would wait for input that can no longer come: ended, saying why.
                log.warning("exec %s: stdin not closed: %s", process.exec_id, exc)
                self._broken = f"its stdin could not be closed ({exc})"

    def _finish(self, status: bytes) -> None:
        with contextlib.suppress(Exception):
            self.send(encode_frame(STATUS, status))
        with contextlib.suppress(Exception):
            self.connection.close()


__all__ = ["ExecSession", "idle_past"]
