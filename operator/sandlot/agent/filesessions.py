"""``sandlot cp`` and ``sandlot port-forward``: a sandbox's files and ports over one
connection each (``agent.toolfiles`` and ``agent.containerfiles`` do the reaching in,
from inside the sandbox).

Files, in ``v5.channel.k8s.io`` frames: a read sends the file on stdout, then the
status; list and stat send one JSON document on stdout; a write takes stdin
frames until the client closes stdin (``[255, 0]``), replaces the file at once,
and answers the status; a mkdir makes one directory (one already there is no
error) and answers the status. Every transfer is capped
(``stream_file_max_bytes``), and a refusal (a path outside the root, no such
file, over the cap) is a failed status with its HTTP code and why.

Port-forward: stdin frames are bytes to the sandbox's port, stdout frames bytes
from it; either side closing ends both. A client that sends nothing for
``idle`` seconds, and a sandbox that stops running, end the session.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sandlot.adapters.sandboxfs import FileRefused
from sandlot.agent.containerfiles import ContainerRoot, PortUnreachable
from sandlot.policy.streams import (
    CLOSE,
    LIST,
    MKDIR,
    READ,
    REMOVE,
    STAT,
    STATUS,
    STDIN,
    STDOUT,
    WRITE,
    StreamRequest,
    decode_frame,
    encode_frame,
    error_status,
    exit_status,
)

log = logging.getLogger(__name__)

MAX_ENTRIES = 10_000
RECV_WAIT = 1.0


Root = ContainerRoot  # or its ToolRoot


def serve_files(
    connection: Any,
    request: StreamRequest,
    open_root: Callable[[], Root],
    *,
    limit: int,
    idle: float,
) -> None:
    """One files operation for ``connection``, on the root ``open_root`` gives (the
    files tool in the sandbox, or the image's own tools); the status always ends it."""
    status = exit_status(0)
    try:
        root = open_root()
    except OSError as e:
        status = error_status(f"cannot reach the sandbox's files: {e}", 503)
    else:
        try:
            _operate(connection, request, root, limit=limit, idle=idle)
        except FileRefused as e:
            status = error_status(e.message, e.status)
        except _ClientGone:
            return
        finally:
            root.close()
    with contextlib.suppress(Exception):
        connection.send(encode_frame(STATUS, status))
    connection.close()


class _ClientGone(Exception):
    pass


def _operate(
    connection: Any, request: StreamRequest, root: Root, *, limit: int, idle: float
) -> None:
    path = request.path
    if request.op == READ:
        for chunk in root.read(path, limit):
            connection.send(encode_frame(STDOUT, chunk))
    elif request.op in (LIST, STAT):
        doc = root.list(path, MAX_ENTRIES) if request.op == LIST else root.stat(path)
        connection.send(encode_frame(STDOUT, json.dumps(doc).encode()))
    elif request.op == WRITE:
        written = root.write(path, _stdin(connection, idle), limit)
        log.info("wrote %d bytes to %s in %s/%s", written, path, request.namespace, request.name)
    elif request.op == MKDIR:
        if root.mkdir(path):
            log.info("made directory %s in %s/%s", path, request.namespace, request.name)
    elif request.op == REMOVE:
        root.remove(path)


def _stdin(connection: Any, idle: float) -> Iterator[bytes]:
    """The client's stdin frames until it closes stdin; ``_ClientGone`` if it leaves
    or says nothing for ``idle`` seconds."""
    while True:
        try:
            message = connection.recv(timeout=idle)
        except TimeoutError:
            raise FileRefused(408, f"no data for {idle:g}s: the transfer was abandoned") from None
        except Exception as e:
            raise _ClientGone(str(e)) from e
        if not isinstance(message, bytes) or not message:
            continue
        channel, data = decode_frame(message)
        if channel == STDIN:
            yield data
        elif channel == CLOSE and data[:1] == bytes([STDIN]):
            return


def serve_port(
    connection: Any,
    request: StreamRequest,
    connect: Callable[[], socket.socket],
    *,
    timeout: float,
    idle: float,
    running: Callable[[], bool],
) -> None:
    """Relay ``connection`` to ``request.port`` in the sandbox, reached by ``connect``
    (the loopback of its network namespace, or its own address)."""
    try:
        conn = connect()
    except (OSError, TimeoutError) as e:
        with contextlib.suppress(Exception):
            connection.send(encode_frame(STATUS, error_status(f"port {request.port}: {e}", 502)))
        connection.close()
        return
    done = threading.Event()
    unreachable: list[str] = []

    def from_sandbox() -> None:
        try:
            while data := conn.recv(64 * 1024):
                connection.send(encode_frame(STDOUT, data))
        except PortUnreachable as e:
            unreachable.append(str(e))
        except Exception as e:
            log.debug("port-forward %s: %s", request.port, e)
        finally:
            done.set()

    reader = threading.Thread(target=from_sandbox, name=f"port-{request.port}", daemon=True)
    reader.start()
    quiet = 0.0
    try:
        while not done.is_set():
            try:
                message = connection.recv(timeout=RECV_WAIT)
            except TimeoutError:
                quiet += RECV_WAIT
                if quiet >= idle or not running():
                    break
                continue
            except Exception:
                break
            quiet = 0.0
            if not isinstance(message, bytes) or not message:
                continue
            channel, data = decode_frame(message)
            if channel == STDIN:
                conn.sendall(data)
            elif channel == CLOSE:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
    finally:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()
        reader.join(timeout)
        status = exit_status(0)
        if unreachable:
            status = error_status(f"port {request.port}: {unreachable[0]}", 502)
        with contextlib.suppress(Exception):
            connection.send(encode_frame(STATUS, status))
        connection.close()


__all__ = ["Root", "serve_files", "serve_port"]
