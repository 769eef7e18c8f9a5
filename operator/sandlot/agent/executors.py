"""How a command of ``sandlot exec`` reaches its sandbox: through the sandbox's
executor when it has one that runs (a fork, a few milliseconds), else through
the runtime's exec (``Tasks.Exec``, tens of milliseconds), counted by reason.

Each sandbox's executor is started at its first command, once: concurrent first
commands wait for that one start. The choice of way and the back-off after an
executor's death are ``policy.executor``'s; this module applies them. Both ways
give the session one face (``Command``), so ``agent.execsession`` serves either
alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from sandlot.adapters.containerd.execs import ExecProcess, Execs
from sandlot.adapters.containerd.executor import ExecutorChannel, ExecutorGone
from sandlot.adapters.runtime import RuntimeError_
from sandlot.agent.metrics import AgentMetrics
from sandlot.policy.executor import (
    ExecutorRecord,
    Fallback,
    Path,
    choose_path,
    died,
    forgettable,
    started,
)
from sandlot.policy.ocispec import EXECUTOR

log = logging.getLogger(__name__)

QUIET = 60.0  # seconds an executor hears nothing from its agent before it ends itself
PING_EVERY = QUIET / 4  # seconds between the agent's pings of each executor


class Command(Protocol):
    """One running command, whichever way it was started."""

    exec_id: str
    takes_stdin: bool

    def outputs(self) -> tuple[str, ...]: ...
    def read(self, name: str) -> bytes: ...
    def write_stdin(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def resize(self, width: int, height: int) -> None: ...
    def kill(self, sig: int = signal.SIGKILL) -> None: ...
    def wait(self, timeout: float) -> int: ...
    def release(self) -> None: ...


class RuntimeCommand:
    """A command as the runtime's exec: containerd's FIFOs and calls."""

    def __init__(self, execs: Execs, process: ExecProcess, call_timeout: float) -> None:
        self.execs = execs
        self.process = process
        self.call_timeout = call_timeout
        self.exec_id = process.exec_id
        self.takes_stdin = process.stdin is not None

    def outputs(self) -> tuple[str, ...]:
        return ("stdout",) if self.process.stderr is None else ("stdout", "stderr")

    def read(self, name: str) -> bytes:
        fd = self.process.stdout if name == "stdout" else self.process.stderr
        assert fd is not None, f"{name} was asked"
        return os.read(fd, 32 * 1024)

    def write_stdin(self, data: bytes) -> None:
        if self.process.stdin is not None and "stdin" not in self.process.closed:
            os.write(self.process.stdin, data)

    def close_stdin(self) -> None:
        self.execs.close_stdin(self.process, timeout=self.call_timeout)

    def resize(self, width: int, height: int) -> None:
        self.execs.resize(self.process, width, height, timeout=self.call_timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.execs.kill(self.process, timeout=self.call_timeout, sig=sig)

    def wait(self, timeout: float) -> int:
        return self.execs.wait(self.process, timeout=timeout)

    def release(self) -> None:
        self.process.release()
        with contextlib.suppress(RuntimeError_):
            self.execs.delete(
                self.process.container_id, self.process.exec_id, timeout=self.call_timeout
            )


def runtime_start(
    execs: Execs,
    container_id: str,
    exec_id: str,
    args: Sequence[str],
    *,
    tty: bool,
    stdin: bool,
    timeout: float,
) -> Command:
    process = execs.start(container_id, exec_id, args, tty=tty, stdin=stdin, timeout=timeout)
    return RuntimeCommand(execs, process, timeout)


class Executors:
    """The node's sandboxes' executors over ``execs``; ``close()`` ends them."""

    def __init__(
        self,
        execs: Execs,
        *,
        call_timeout: float,
        metrics: AgentMetrics | None = None,
        quiet: float = QUIET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.execs = execs
        self.call_timeout = call_timeout
        self.metrics = metrics
        self.quiet = quiet
        self.clock = clock
        self._lock = threading.Lock()
        self._channels: dict[str, ExecutorChannel] = {}
        self._records: dict[str, ExecutorRecord] = {}
        self._starting: dict[str, threading.Lock] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._ping, name="executor pings", daemon=True).start()

    def start(
        self,
        container_id: str,
        exec_id: str,
        args: Sequence[str],
        *,
        tty: bool,
        stdin: bool,
        timeout: float,
    ) -> Command:
        """``args`` running in the container, through its executor when it can."""
        channel, fallback = self._channel(container_id)
        if channel is not None:
            try:
                process = channel.open(args, tty=tty, stdin=stdin)
                self._count("executor")
                return process
            except ExecutorGone as e:
                log.info("%s; %s goes through the runtime", e, exec_id)
                fallback = Fallback.BROKEN
        if self.metrics is not None and fallback is not None:
            self.metrics.exec_fallbacks.labels(fallback.value).inc()
        command = runtime_start(
            self.execs, container_id, exec_id, args, tty=tty, stdin=stdin, timeout=timeout
        )
        self._count("runtime")
        return command

    def _count(self, via: str) -> None:
        if self.metrics is not None:
            self.metrics.exec_commands.labels(via).inc()

    def _channel(self, container_id: str) -> tuple[ExecutorChannel | None, Fallback | None]:
        with self._lock:
            starting = self._starting.setdefault(container_id, threading.Lock())
        # One start per sandbox; the others wait for it (a start is bounded by its calls).
        if not starting.acquire(timeout=3 * self.call_timeout):
            return None, Fallback.BACKOFF
        try:
            return self._channel_locked(container_id)
        finally:
            starting.release()

    def _channel_locked(self, container_id: str) -> tuple[ExecutorChannel | None, Fallback | None]:
        now = self.clock()
        with self._lock:
            channel = self._channels.get(container_id)
            if channel is not None and not channel.running:
                del self._channels[container_id]
                record = self._records.get(container_id, ExecutorRecord())
                self._records[container_id] = died(record, now)
                channel = None
            record = self._records.get(container_id, ExecutorRecord())
        if channel is not None:
            return channel, None
        try:
            spec = self.execs.container_spec(container_id, timeout=self.call_timeout)
        except RuntimeError_:
            return None, Fallback.START_FAILED  # the runtime's exec says why, if it can
        mounted = any(m.get("destination") == EXECUTOR for m in spec.get("mounts") or [])
        choice = choose_path(record, now, mounted=mounted, running=False)
        if choice.path is not Path.START:
            return None, choice.reason
        channel = ExecutorChannel(
            self.execs, container_id, call_timeout=self.call_timeout, quiet=self.quiet
        )
        try:
            channel.start(spec)
        except RuntimeError_ as e:
            log.warning("cannot start the executor in %s: %s", container_id, e)
            channel.close()
            with self._lock:
                self._records[container_id] = died(record, self.clock())
            if self.metrics is not None:
                self.metrics.executor_starts.labels("failed").inc()
            return None, Fallback.START_FAILED
        if self.metrics is not None:
            self.metrics.executor_starts.labels("started").inc()
        with self._lock:
            self._channels[container_id] = channel
            self._records[container_id] = started(record, self.clock())
        return channel, None

    def _ping(self) -> None:
        while not self._stop.wait(min(PING_EVERY, self.quiet / 4)):
            now = self.clock()
            with self._lock:
                channels = list(self._channels.values())
                for key, record in list(self._records.items()):
                    if key not in self._channels and forgettable(record, now):
                        del self._records[key]
                        self._starting.pop(key, None)
            for channel in channels:
                channel.ping()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()


__all__ = ["Command", "Executors", "RuntimeCommand", "runtime_start"]
