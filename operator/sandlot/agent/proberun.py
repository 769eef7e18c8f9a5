"""Running one readiness probe of a sandbox, bounded by its ``timeoutSeconds``.

``exec`` goes through the agent's exec machinery on containerd (``Tasks.Exec`` on
a channel of the prober's own, so probes never queue behind a user's exec); its
output is drained as it comes (a chatty command must not block on a full pipe)
and a short head of it kept for the condition's message; past the timeout the
process is killed. ``tcpSocket`` and ``httpGet`` connect to ``127.0.0.1:port``
inside the sandbox's network namespace (``adapters.sandboxfs``), so a probe
reaches a port the sandbox serves only on its loopback, and nothing the network
policy keeps from the node is needed. That namespace is the named one the agent
made for it, else the task's through the node's ``/proc`` once that pid is shown
to be the task (its cgroup); where neither holds (gVisor, or the chart's default
install, whose agent has no node PIDs) the container's own ``nc`` or ``wget`` make
the probe inside it.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from sandlot.adapters.containerd.execs import ExecProcess, Execs
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout
from sandlot.adapters.sandboxfs import connect_in_netns, task_netns
from sandlot.api.probe import Probe
from sandlot.policy.ocispec import network_namespace_path
from sandlot.policy.runtimeclass import host_view

OUTPUT_KEPT = 512  # bytes of a command's output kept for the message
DRAIN_WAIT = 1.0  # seconds the output gets to reach EOF after the exit
READ_SLICE = 0.2  # seconds of one select on the output, so a stop is seen between them
STATUS_LINE_MAX = 4096
_STATUS_LINE = re.compile(rb"^HTTP/\d(?:\.\d)? (\d{3})")


def handler_of(probe: Probe) -> str:
    if probe.exec is not None:
        return "exec"
    return "httpGet" if probe.http_get is not None else "tcpSocket"


class _Output:
    """Drains an exec's output FIFOs on a thread of its own, keeping the first bytes."""

    def __init__(self, process: ExecProcess) -> None:
        self._fds = [fd for fd in (process.stdout, process.stderr) if fd is not None]
        self.kept = bytearray()
        self._stop = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        open_fds = list(self._fds)
        try:
            while open_fds and not self._stop.is_set():
                readable, _, _ = select.select(open_fds, [], [], READ_SLICE)
                for fd in readable:
                    data = os.read(fd, 4096)
                    if not data:
                        open_fds.remove(fd)
                    elif len(self.kept) < OUTPUT_KEPT:
                        self.kept += data[: OUTPUT_KEPT - len(self.kept)]
        except OSError:
            pass  # closed under us: the probe is over either way
        finally:
            self.done.set()

    def text(self) -> str:
        return " ".join(self.kept.decode(errors="replace").split())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(READ_SLICE * 2)


class ProbeRunner:
    """Runs probes; every call returns ``(passed, message)`` within its bounds. The
    exec channel (and its FIFO directory) is opened at the first probe."""

    def __init__(
        self, open_channel: Callable[[], Execs], *, proc_root: str, call_timeout: float
    ) -> None:
        self._open_channel = open_channel
        self._channel: Execs | None = None
        self._lock = threading.Lock()
        self.proc_root = proc_root
        self.call_timeout = call_timeout

    @property
    def execs(self) -> Execs:
        with self._lock:
            if self._channel is None:
                self._channel = self._open_channel()
            return self._channel

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def run(self, container_id: str, probe: Probe) -> tuple[bool, str]:
        timeout = float(probe.timeout_seconds)
        try:
            if probe.exec is not None:
                return self._exec(container_id, probe.exec.command, timeout)
            runtime = self.execs.runtime_of(container_id, timeout=self.call_timeout)
            if not host_view(runtime):  # its sockets are the sandbox kernel's, not the node's
                return self._inside(container_id, probe, timeout)
            netns = self._netns(container_id)
            if netns is None:  # the node's view of the task is not the agent's
                return self._inside(container_id, probe, timeout)
            try:
                if probe.tcp_socket is not None:
                    port = probe.tcp_socket.port
                    connect_in_netns(netns, port, timeout=timeout).close()
                    return True, f"tcp port {port} accepted a connection"
                assert probe.http_get is not None, "a probe has exactly one handler"
                return self._http(netns, probe.http_get.port, probe.http_get.path, timeout)
            finally:
                if isinstance(netns, int):
                    os.close(netns)
        except (RuntimeError_, OSError, TimeoutError) as exc:
            return False, f"{handler_of(probe)}: {exc}"

    def _netns(self, container_id: str) -> int | str | None:
        """The container's network namespace as the agent can reach it: the named
        one its spec joins (made by this agent), else the task's through the node's
        ``/proc`` where that pid is verifiably the task (an open descriptor), else
        None (the chart's default install: no node PIDs, so the probe runs inside)."""
        spec = self.execs.container_spec(container_id, timeout=self.call_timeout)
        named = network_namespace_path(spec)
        if named is not None:
            return named
        pid = self.execs.task_pid(container_id, timeout=self.call_timeout)
        cgroups_path = str((spec.get("linux") or {}).get("cgroupsPath") or "")
        return task_netns(self.proc_root, pid, cgroups_path)

    def _exec(self, container_id: str, command: Sequence[str], timeout: float) -> tuple[bool, str]:
        exec_id = f"probe-{uuid.uuid4().hex[:12]}"
        process = self.execs.start(
            container_id, exec_id, command, tty=False, stdin=False, timeout=self.call_timeout
        )
        output = _Output(process)
        try:
            try:
                code = self.execs.wait(process, timeout=timeout)
            except RuntimeTimeout:
                with contextlib.suppress(RuntimeError_):
                    self.execs.kill(process, timeout=self.call_timeout)
                with contextlib.suppress(RuntimeError_):
                    self.execs.wait(process, timeout=self.call_timeout)
                return False, f"exec {command[0]!r} took over {timeout:g}s: killed"
            output.done.wait(DRAIN_WAIT)
            said = output.text()
            return code == 0, f"exec {command[0]!r} exited {code}" + (f": {said}" if said else "")
        finally:
            output.stop()
            process.release()
            with contextlib.suppress(RuntimeError_):
                self.execs.delete(container_id, exec_id, timeout=self.call_timeout)

    def _inside(self, container_id: str, probe: Probe, timeout: float) -> tuple[bool, str]:
        """A tcpSocket or httpGet probe made by the container's own tools (busybox's
        where the image lacks them), for a runtime whose network the node cannot
        enter (gVisor): ``nc`` to the port, ``wget`` of the path (a 4xx or 5xx answer
        fails, as the kubelet's; a redirect is followed). The exec's own deadline
        bounds it."""
        argv = inside_probe_argv(probe, timeout)
        try:
            passed, said = self._exec(container_id, argv, timeout)
        except RuntimeTimeout:
            raise
        except RuntimeError_:  # not started: the image has no such tool
            passed, said = False, f"exec {argv[0]!r} exited 127"
        if not passed and said.startswith(f"exec {argv[0]!r} exited 127"):
            return self._exec(container_id, ["busybox", *argv], timeout)
        return passed, said

    def _http(self, netns: int | str, port: int, path: str, timeout: float) -> tuple[bool, str]:
        began = time.monotonic()
        with connect_in_netns(netns, port, timeout=timeout) as conn:
            request = (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "User-Agent: sandlot-probe\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            )
            conn.settimeout(max(timeout - (time.monotonic() - began), 0.01))
            conn.sendall(request.encode())
            line = _status_line(conn, began + timeout)
        match = _STATUS_LINE.match(line)
        if match is None:
            return False, f"GET {path} on port {port}: not an HTTP answer"
        code = int(match.group(1))
        return 200 <= code < 400, f"GET {path} on port {port}: HTTP {code}"


def inside_probe_argv(probe: Probe, timeout: float) -> list[str]:
    """The command a tcpSocket or httpGet probe runs inside the container: busybox's
    ``nc`` and ``wget`` take these (its ``nc`` has no ``-z``: it connects and, its
    input empty, exits 0; its ``wget -T`` crashes under gVisor, and the exec's own
    deadline bounds the request anyway)."""
    if probe.tcp_socket is not None:
        wait = str(max(int(timeout), 1))
        return ["nc", "-w", wait, "127.0.0.1", str(probe.tcp_socket.port)]
    assert probe.http_get is not None, "a probe has exactly one handler"
    url = f"http://127.0.0.1:{probe.http_get.port}{probe.http_get.path}"
    return ["wget", "-q", "-O", "/dev/null", url]


def _status_line(conn: socket.socket, deadline: float) -> bytes:
    """The answer's first line (capped), read before ``deadline`` (monotonic)."""
    received = b""
    while b"\r\n" not in received and len(received) < STATUS_LINE_MAX:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no HTTP status line within the probe's timeout")
        conn.settimeout(left)
        chunk = conn.recv(STATUS_LINE_MAX)
        if not chunk:
            break
        received += chunk
    return received.split(b"\r\n", 1)[0]


__all__ = ["ProbeRunner", "handler_of", "inside_probe_argv"]
