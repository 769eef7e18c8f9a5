"""The listening sockets of sandlot's TLS servers: the agent's stream server (its
node's sandboxes), the gateway (the API server's front proxy) and the gateway's
router. ``TlsListener`` is what the three hold alike; ``listen_for_streams`` is the
one websocket configuration of the channel protocol the first two both speak, a
bind that fails naming the settings behind it, and a thread that serves it."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from sandlot.adapters.mtls import hand_new_connections_to
from sandlot.adapters.startup import cannot_listen
from sandlot.policy.streams import SUBPROTOCOL

MAX_MESSAGE = 1 << 20
"""Bytes of one websocket message at most, either way."""
CLOSE_TIMEOUT = 2.0
"""Seconds a closing connection waits for the other side's close."""


class Listening(Protocol):
    @property
    def socket(self) -> socket.socket: ...


L = TypeVar("L", bound=Listening)


class TlsListener(Generic[L]):
    """What sandlot's TLS listeners (the agent's stream server, the gateway and its
    router) have alike: the address they are asked for, the port they got once
    started, and their serving TLS, which ``serve_tls`` replaces for the connections
    accepted from then on."""

    listening_as = "the server"
    """Who is not listening yet, in the error ``port`` raises before ``start()``."""

    def __init__(self, *, bind: str, port: int, server_tls: ssl.SSLContext) -> None:
        self.bind = bind
        self.requested_port = port
        self._server_tls = server_tls
        self._server: L | None = None

    @property
    def port(self) -> int:
        """The port bound; ``RuntimeError`` before ``start()``."""
        if self._server is None:
            raise RuntimeError(f"{self.listening_as} is not listening")
        return int(self._server.socket.getsockname()[1])

    def serve_tls(self, ctx: ssl.SSLContext) -> None:
        """Serve connections accepted from now on with ``ctx`` (a new certificate, or
        a changed set of trusted front-proxy CAs); open connections keep theirs."""
        self._server_tls = ctx
        if self._server is not None:
            hand_new_connections_to(self._server.socket, ctx)


def listen_for_streams(
    handler: Callable[[ServerConnection], None],
    *,
    bind: str,
    port: int,
    tls: ssl.SSLContext,
    open_timeout: float,
    process_request: Callable[[ServerConnection, Request], Response | None],
    process_response: Callable[[ServerConnection, Request, Response], Response | None],
    create_connection: type[ServerConnection],
    settings: str,
    thread: str,
) -> Server:
    """Serve ``handler`` on ``bind``:``port`` (``""``: every address; 0: any free
    port) over ``tls``, from a daemon thread named ``thread``. An address that
    cannot be bound is a ``StartupError`` naming ``settings``."""
    try:
        server = serve(
            handler,
            bind or "",
            port,
            ssl=tls,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            compression=None,
            max_size=MAX_MESSAGE,
            open_timeout=open_timeout,
            close_timeout=CLOSE_TIMEOUT,
            process_request=process_request,
            process_response=process_response,
            create_connection=create_connection,
        )
    except OSError as e:
        raise cannot_listen(settings, f"{bind or '*'}:{port}", e) from None
    threading.Thread(target=server.serve_forever, name=thread, daemon=True).start()
    return server


__all__ = [
    "CLOSE_TIMEOUT",
    "MAX_MESSAGE",
    "Listening",
    "TlsListener",
    "listen_for_streams",
]
