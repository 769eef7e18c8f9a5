"""``Sandbox.port``: a local address whose connections reach a port inside the
sandbox's network namespace, each over its own ``sandboxes/portforward`` stream
(as ``sandlot port-forward`` does), so parallel connections all go through.

A connection that cannot be carried (refused by RBAC, nothing listening in the
sandbox yet) is closed at once, and its reason kept in ``Tunnel.last_error``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from sandlot.adapters.streamclient import Stream
from sandlot.client.commands import CHUNK, ClosedOnExit, read_status, stdout_until_status
from sandlot.client.errors import SandlotError
from sandlot.policy.streams import (
    STDIN,
    close_stdin_frame,
    encode_frame,
)


class Tunnel(ClosedOnExit):
    """Listening on ``address`` until closed (``with`` closes it)."""

    def __init__(
        self, open_stream: Callable[[], Stream], host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self._open = open_stream
        self._server = socket.create_server((host, port))
        self._closed = threading.Event()
        self._streams: set[Stream] = set()
        self._lock = threading.Lock()
        self.last_error: str | None = None
        threading.Thread(target=self._accept, name="sandlot-tunnel", daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the local end."""
        host, port = self.address
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            stream = self._open()
        except SandlotError as e:
            self.last_error = str(e)
            conn.close()
            return
        with self._lock:
            self._streams.add(stream)
        threading.Thread(target=self._to_sandbox, args=(conn, stream), daemon=True).start()
        try:
            status = stdout_until_status(stream, lambda: None, conn.sendall)
            if status is not None and (outcome := read_status(status)).exit_code != 0:
                self.last_error = outcome.message
        except OSError:
            pass  # the local side went away
        finally:
            with self._lock:
                self._streams.discard(stream)
            stream.close()
            conn.close()

    @staticmethod
    def _to_sandbox(conn: socket.socket, stream: Stream) -> None:
        with contextlib.suppress(Exception):  # either side closing ends the relay
            while data := conn.recv(CHUNK):
                stream.send(encode_frame(STDIN, data))
            stream.send(close_stdin_frame())


__all__ = ["Tunnel"]
