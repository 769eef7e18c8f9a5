"""What reaching into a sandbox from its node shares: a refused file operation
(``FileRefused``, which the files API answers with its HTTP status and why), and a
connection to a port of the sandbox's network namespace (``<proc>/<pid>/ns/net``,
for the readiness probes), made by a thread that joins that namespace just long
enough to create the socket.

The files themselves are reached from inside the sandbox, never through the
node's ``/proc`` (``agent.toolfiles``).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


class FileRefused(Exception):
    """A file operation refused: an HTTP status and why (for the user)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def connect_in_netns(proc: str, pid: int, port: int, *, timeout: float) -> socket.socket:
    """A TCP connection to ``127.0.0.1:port`` inside the task's network namespace."""
    result: list[socket.socket | BaseException] = []

    def inside() -> None:
        try:
            target = os.open(f"{proc}/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(target, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
            finally:
                os.close(target)
            # This thread ends right after: its namespace goes with it.
            result.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except BaseException as e:  # handed to the caller
            result.append(e)

    thread = threading.Thread(target=inside, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if not result:
        raise TimeoutError(f"no connection to port {port} within {timeout:g}s")
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    outcome.settimeout(None)
    return outcome


__all__ = ["FileRefused", "connect_in_netns"]
