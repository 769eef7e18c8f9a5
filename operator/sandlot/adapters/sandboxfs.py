"""What reaching into a sandbox from its node shares: a refused file operation
(``FileRefused``, which the files API answers with its HTTP status and why), and a
connection to a port of the sandbox's network namespace (the named one its agent
made, or the task's ``<proc>/<pid>/ns/net`` where that pid is verifiably the task),
for the readiness probes, made by a thread that joins that namespace just long
enough to create the socket.

The files themselves are reached from inside the sandbox, never through the
node's ``/proc`` (``agent.toolfiles``).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

from sandlot.policy.ocispec import in_cgroup

CLONE_NEWNET = 0x40000000
CGROUP_FILE_MAX = 64 * 1024  # bytes of /proc/<pid>/cgroup read at most

_libc = ctypes.CDLL(None, use_errno=True)


class FileRefused(Exception):
    """A file operation refused: an HTTP status and why (for the user)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def task_netns(proc: str, pid: int, cgroups_path: str) -> int | None:
    """An open descriptor of the task's network namespace through ``proc``, where
    ``<proc>/<pid>`` is the task: in the container's cgroup (``cgroups_path``). None
    where it is not: an agent without the node's PIDs sees its own namespace's, in
    which the task's pid names nothing or another process. The directory is opened
    first and both files read through it, so a pid reused in between is not read."""
    try:
        directory = os.open(f"{proc}/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        cgroup = os.open("cgroup", os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
        with os.fdopen(cgroup, encoding="utf-8", errors="replace") as file:
            if not in_cgroup(file.read(CGROUP_FILE_MAX), cgroups_path):
                return None
        return os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return None
    finally:
        os.close(directory)


def connect_in_netns(netns: int | str, port: int, *, timeout: float) -> socket.socket:
    """A TCP connection to ``127.0.0.1:port`` inside a network namespace: an open
    descriptor of it (the caller's to close) or the path of a named one."""
    result: list[socket.socket | BaseException] = []

    def inside() -> None:
        try:
            target = netns if isinstance(netns, int) else os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(target, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
            finally:
                if target is not netns:
                    os.close(target)
            # This thread ends right after: its namespace goes with it.
            result.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except BaseException as e:  # handed to the caller
            result.append(e)

    thread = threading.Thread(target=inside, name=f"netns-{port}", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if not result:
        raise TimeoutError(f"no connection to port {port} within {timeout:g}s")
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    outcome.settimeout(None)
    return outcome


__all__ = ["FileRefused", "connect_in_netns", "task_netns"]
