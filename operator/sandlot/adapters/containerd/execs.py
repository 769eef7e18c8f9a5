"""A command run in a sandbox's running container: containerd's ``Tasks.Exec``.

The process is the container's own process spec (user, environment, working
directory, capabilities, limits) with the command's arguments and ``terminal``
replaced, so an exec never has more than the sandbox itself. Its stdio are
FIFOs made here, in a directory of their own, as containerd's ``cio`` makes
them: the shim opens the other ends during ``Tasks.Start``. Output FIFOs are
opened non-blocking before the exec exists (so no open waits for the shim) and
switched to blocking once it started, so a read ends with EOF only when the
shim closed its end after the process exited. With ``terminal`` the shim
allocates a pty and stdout carries it (no stderr); ``resize`` is ``ResizePty``.

Every call has its deadline; only ``wait`` is long, and it is one bounded
``Tasks.Wait`` at a time so its caller can give up between them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2

from sandlot.adapters.containerd.connection import Connection
from sandlot.adapters.containerd.gen.services.tasks.v1 import tasks_pb2
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import NotFound, RuntimeError_, RuntimeTimeout

PROCESS_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Process"
STARTS_PER_CONTAINER = 4
START_QUEUE_WAIT = 60.0  # seconds a start waits for its turn in one container
CLOSE_STDIN_TRIES = 3  # CloseIO calls before an exec's stdin is given up as unclosable

log = logging.getLogger(__name__)


@dataclass
class ExecProcess:
    """A started exec: its id and the agent's ends of its FIFOs (None: not asked)."""

    container_id: str
    exec_id: str
    stdin: int | None
    stdout: int
    stderr: int | None
    directory: str
    closed: set[str] = field(default_factory=set)

    def close_stdin_fd(self) -> None:
        if self.stdin is not None and "stdin" not in self.closed:
            self.closed.add("stdin")
            with contextlib.suppress(OSError):
                os.close(self.stdin)

    def release(self) -> None:
        """Close every FIFO end and remove their directory."""
        self.close_stdin_fd()
        for name, fd in (("stdout", self.stdout), ("stderr", self.stderr)):
            if fd is not None and name not in self.closed:
                self.closed.add(name)
                with contextlib.suppress(OSError):
                    os.close(fd)
        shutil.rmtree(self.directory, ignore_errors=True)


def exec_process_spec(
    container_spec: dict[str, Any], args: Sequence[str], tty: bool, *, bare: bool = False
) -> dict[str, Any]:
    """The container's process spec with ``args`` and ``terminal`` replaced; ``bare``
    also takes every capability away (its user, groups and masks stay the sandbox's)."""
    process = dict(container_spec.get("process") or {})
    process["args"] = list(args)
    process["terminal"] = tty
    if bare:
        process["capabilities"] = {
            k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
        }
        process["noNewPrivileges"] = True
    process.pop("consoleSize", None)
    if tty and not any(e.startswith("TERM=") for e in process.get("env") or []):
        process["env"] = [*(process.get("env") or []), "TERM=xterm"]
    return process


def _fifo(directory: str, name: str, flags: int) -> tuple[str, int]:
    path = os.path.join(directory, name)
    os.mkfifo(path, 0o600)
    return path, os.open(path, flags)


def _set_blocking(fd: int | None) -> None:
    if fd is not None:
        os.set_blocking(fd, True)


class Execs:
    """Exec processes in one containerd namespace, on one ``Connection``."""

    def __init__(self, conn: Connection, fifo_root: str | None = None) -> None:
        self._conn = conn
        self._fifo_root = fifo_root
        self._lock = threading.Lock()
        self._starting: dict[str, tuple[threading.BoundedSemaphore, int]] = {}

    def start(
        self,
        container_id: str,
        exec_id: str,
        args: Sequence[str],
        *,
        tty: bool,
        stdin: bool,
        timeout: float,
        bare: bool = False,
    ) -> ExecProcess:
        """Start ``args`` in the container (``bare``: with no capabilities). At most
        ``STARTS_PER_CONTAINER`` starts of one container are in flight: containerd
        takes them one at a time, so a burst would spend every call's deadline queued
        inside it. The rest wait here, for at most ``START_QUEUE_WAIT``; each start
        then has ``timeout`` of its own."""
        slot = self._slot(container_id)
        try:
            if not slot.acquire(timeout=START_QUEUE_WAIT):
                raise RuntimeTimeout(
                    f"{STARTS_PER_CONTAINER} execs were starting in {container_id} for "
                    f"{START_QUEUE_WAIT:g}s and none finished"
                )
            try:
                return self._start(
                    container_id, exec_id, args, tty=tty, stdin=stdin, timeout=timeout, bare=bare
                )
            finally:
                slot.release()
        finally:
            self._unslot(container_id)

    def _slot(self, container_id: str) -> threading.BoundedSemaphore:
        with self._lock:
            slot, users = self._starting.get(container_id) or (
                threading.BoundedSemaphore(STARTS_PER_CONTAINER),
                0,
            )
            self._starting[container_id] = (slot, users + 1)
            return slot

    def _unslot(self, container_id: str) -> None:
        with self._lock:
            slot, users = self._starting[container_id]
            if users <= 1:
                del self._starting[container_id]  # no entry outlives its last caller
            else:
                self._starting[container_id] = (slot, users - 1)

    def _start(
        self,
        container_id: str,
        exec_id: str,
        args: Sequence[str],
        *,
        tty: bool,
        stdin: bool,
        timeout: float,
        bare: bool,
    ) -> ExecProcess:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        spec = exec_process_spec(
            self.container_spec(container_id, timeout=budget), args, tty, bare=bare
        )
        directory = tempfile.mkdtemp(prefix=f"exec-{exec_id}-", dir=self._fifo_root)
        fds: list[int] = []
        try:
            # O_RDWR for stdin: opening never waits for a reader, and writes go to the shim's.
            in_path, in_fd = _fifo(directory, "stdin", os.O_RDWR) if stdin else ("", None)
            if in_fd is not None:
                fds.append(in_fd)
            out_path, out_fd = _fifo(directory, "stdout", os.O_RDONLY | os.O_NONBLOCK)
            fds.append(out_fd)
            err_path, err_fd = (
                ("", None) if tty else _fifo(directory, "stderr", os.O_RDONLY | os.O_NONBLOCK)
            )
            if err_fd is not None:
                fds.append(err_fd)
            self._conn.call(
                self._conn.tasks.Exec,
                tasks_pb2.ExecProcessRequest(
                    container_id=container_id,
                    exec_id=exec_id,
                    stdin=in_path,
                    stdout=out_path,
                    stderr=err_path,
                    terminal=tty,
                    spec=any_pb2.Any(type_url=PROCESS_TYPE_URL, value=json.dumps(spec).encode()),
                ),
                timeout=budget,
                what=f"Tasks.Exec {container_id} {exec_id}",
            )
            try:
                self._conn.call(
                    self._conn.tasks.Start,
                    tasks_pb2.StartRequest(container_id=container_id, exec_id=exec_id),
                    timeout=budget,
                    what=f"Tasks.Start {container_id} {exec_id}",
                )
            except RuntimeError_:
                with contextlib.suppress(RuntimeError_):
                    self.delete(container_id, exec_id, timeout=budget.remaining("Tasks.Delete"))
                raise
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        _set_blocking(out_fd)
        _set_blocking(err_fd)
        return ExecProcess(container_id, exec_id, in_fd, out_fd, err_fd, directory)

    def resize(self, process: ExecProcess, width: int, height: int, *, timeout: float) -> None:
        self._conn.call(
            self._conn.tasks.ResizePty,
            tasks_pb2.ResizePtyRequest(
                container_id=process.container_id,
                exec_id=process.exec_id,
                width=width,
                height=height,
            ),
            timeout=timeout,
            what=f"Tasks.ResizePty {process.container_id} {process.exec_id}",
        )

    def close_stdin(
        self, process: ExecProcess, *, timeout: float, tries: int = CLOSE_STDIN_TRIES
    ) -> None:
        """End the process's stdin: the shim closes its end once it has copied what came.

        Our end is closed first; the shim holds a writer of its own until ``CloseIO``,
        so a lost ``CloseIO`` leaves the process reading forever. It is asked again
        (it is idempotent) when containerd did not answer within ``timeout``, up to
        ``tries`` times; a process already gone has nothing left to close."""
        process.close_stdin_fd()
        what = f"Tasks.CloseIO {process.container_id} {process.exec_id}"
        request = tasks_pb2.CloseIORequest(
            container_id=process.container_id, exec_id=process.exec_id, stdin=True
        )
        for attempt in range(1, tries + 1):
            try:
                self._conn.call(self._conn.tasks.CloseIO, request, timeout=timeout, what=what)
                return
            except NotFound:
                return
            except RuntimeTimeout as exc:
                if attempt == tries:
                    raise
                log.warning("%s (try %d of %d), asking again", exc, attempt, tries)

    def wait(self, process: ExecProcess, *, timeout: float) -> int:
        """The exit code; ``RuntimeTimeout`` when it has not exited within ``timeout``."""
        response = self._conn.call(
            self._conn.tasks.Wait,
            tasks_pb2.WaitRequest(container_id=process.container_id, exec_id=process.exec_id),
            timeout=timeout,
            what=f"Tasks.Wait {process.container_id} {process.exec_id}",
        )
        return int(response.exit_status)

    def kill(self, process: ExecProcess, *, timeout: float, sig: int = signal.SIGKILL) -> None:
        self._conn.call(
            self._conn.tasks.Kill,
            tasks_pb2.KillRequest(
                container_id=process.container_id, exec_id=process.exec_id, signal=sig
            ),
            timeout=timeout,
            what=f"Tasks.Kill {process.container_id} {process.exec_id}",
        )

    def task_pid(self, container_id: str, *, timeout: float) -> int:
        """The pid (in containerd's pid namespace) of the container's running task."""
        response = self._conn.call(
            self._conn.tasks.Get,
            tasks_pb2.GetRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Get {container_id}",
        )
        return int(response.process.pid)

    def runtime_of(self, container_id: str, *, timeout: float) -> str:
        """The shim containerd runs the container with (its ``runtime.name``)."""
        container = self._conn.get_container(container_id, timeout=timeout)
        return str(container.runtime.name)

    def container_spec(self, container_id: str, *, timeout: float | Deadline) -> dict[str, Any]:
        """The container's OCI spec."""
        container = self._conn.get_container(container_id, timeout=timeout)
        spec: dict[str, Any] = json.loads(container.spec.value or b"{}")
        return spec

    def mounts_in(self, container_id: str, *, timeout: float) -> frozenset[str]:
        """The destinations of the container's mounts (its spec's)."""
        spec = self.container_spec(container_id, timeout=timeout)
        return frozenset(str(m.get("destination")) for m in spec.get("mounts") or [])

    def close(self) -> None:
        self._conn.close()

    def delete(self, container_id: str, exec_id: str, *, timeout: float) -> None:
        self._conn.call(
            self._conn.tasks.DeleteProcess,
            tasks_pb2.DeleteProcessRequest(container_id=container_id, exec_id=exec_id),
            timeout=timeout,
            what=f"Tasks.DeleteProcess {container_id} {exec_id}",
        )


def open_execs(address: str, namespace: str, fifo_root: str | None = None) -> Execs:
    """Execs on a channel of their own: a long exec never shares the agent's. The
    shim opens the FIFOs by path from the node, so ``fifo_root`` must be a directory
    the node sees at the same path (in a pod: a host directory mounted where it is)."""
    if fifo_root:
        os.makedirs(fifo_root, mode=0o700, exist_ok=True)
    return Execs(Connection(address, namespace), fifo_root)


__all__ = ["PROCESS_TYPE_URL", "ExecProcess", "Execs", "exec_process_spec", "open_execs"]
