"""The listening socket both stream servers open, the agent's (its node's sandboxes)
and the gateway's (the API server's front proxy): one websocket configuration for
the channel protocol they both speak, a bind that fails naming the settings behind
it, and a thread that serves it."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from typing import Any

from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from sandlot.adapters.startup import cannot_listen
from sandlot.policy.streams import SUBPROTOCOL

MAX_MESSAGE = 1 << 20
"""Bytes of one websocket message at most, either way."""
CLOSE_TIMEOUT = 2.0
"""Seconds a closing connection waits for the other side's close."""


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


def bound_port(server: Any, what: str) -> int:
    """The port ``server`` (a websockets or ``socketserver`` server) listens on;
    ``RuntimeError`` naming ``what`` before it listens."""
    if server is None:
        raise RuntimeError(f"{what} is not listening")
    return int(server.socket.getsockname()[1])


__all__ = ["CLOSE_TIMEOUT", "MAX_MESSAGE", "bound_port", "listen_for_streams"]
