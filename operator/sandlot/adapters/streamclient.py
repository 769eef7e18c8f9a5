"""The CLI's side of ``sandlot logs`` / ``sandlot exec``: a WebSocket to the
sandbox's ``log`` or ``exec`` subresource on the API server.

Like ``kubectl exec``, it talks to the API server alone, with the kubeconfig's
own identity (a token or a client certificate): the API server authenticates it
and hands the stream to sandlot's gateway with the user's name, never the
credential. Nothing the CLI reads tells it where a node is.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import threading
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, reconnect
from websockets.sync.utils import Deadline
from websockets.typing import Subprotocol

from sandlot.adapters.objects import Objects
from sandlot.api.errors import UsageError
from sandlot.policy.streams import SUBPROTOCOL

CONNECT_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0  # seconds a close waits for the other side's close frame
READ_SIZE = 64 * 1024


class StreamRefused(Exception):
    """The API server or the agent answered the upgrade with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def check_sandbox(api: client.ApiClient, namespace: str, name: str) -> str:
    """The sandbox's phase; a ``UsageError`` when it does not exist or has no node yet,
    said before any stream is opened."""
    try:
        sandbox = Objects(api).get_sandbox(namespace, name)
    except ApiException as e:
        if e.status == 404:
            raise UsageError(f'sandbox "{name}" not found in namespace {namespace}') from None
        raise
    phase = str((sandbox.get("status") or {}).get("phase") or "Pending")
    if not (sandbox.get("spec") or {}).get("nodeName"):
        raise UsageError(f'sandbox "{name}" is {phase} and not on any node yet')
    return phase


def is_forbidden(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status in (401, 403)


def _auth_headers(cfg: Any) -> dict[str, str]:
    """The kubeconfig's bearer token as a header, if it has one (a client certificate
    goes in the TLS context instead)."""
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
    return {"Authorization": value} if value else {}


def _file_state(path: str | None) -> tuple[str, int, int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1)
    return (path, st.st_mtime_ns, st.st_size)


_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}
_CONTEXTS_LOCK = threading.Lock()
MAX_CONTEXTS = 32


def _tls(cfg: Any) -> ssl.SSLContext | None:
    """The kubeconfig's TLS context, kept while its files are unchanged: a program's
    streams one after another load no CA and no key again. None for a plain
    ``http`` server. (Resuming the API server's TLS sessions was measured and
    dropped: Python copies a session, certificates and all, holding the GIL, each
    time it is read or used, which cost more than the handshake it saved.)"""
    if not cfg.host.startswith("https"):
        return None
    key = (
        bool(cfg.verify_ssl),
        _file_state(cfg.ssl_ca_cert),
        _file_state(cfg.cert_file),
        _file_state(cfg.key_file),
    )
    with _CONTEXTS_LOCK:
        kept = _CONTEXTS.get(key)
    if kept is None:
        kept = _tls_context(cfg)
        with _CONTEXTS_LOCK:
            if len(_CONTEXTS) >= MAX_CONTEXTS:
                _CONTEXTS.clear()
            kept = _CONTEXTS.setdefault(key, kept)
    return kept


def _tls_context(cfg: Any) -> ssl.SSLContext:
    """The kubeconfig's TLS settings (its CA, client certificate, verification) as a
    context for an ``https`` server."""
    if not cfg.verify_ssl:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return context


def _refusal_message(body: bytes | bytearray) -> str:
    text = bytes(body).decode(errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(parsed, dict) and parsed.get("message"):
        return str(parsed["message"])  # a metav1.Status from the API server itself
    return text.strip()


class Stream:
    """One open stream: binary messages in and out; ``recv`` answers None once closed.

    websockets' sync client frames it: its own thread reads the socket and queues
    whole messages; ``send`` writes from the caller's thread. Callers read and write
    at once (a stdin or resize thread sends while the caller waits in ``recv``)."""

    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection

    def recv(self, timeout: float | None = None) -> bytes | None:
        """The next message; None once closed. With ``timeout`` (seconds), a
        ``TimeoutError`` when nothing came in time."""
        try:
            return self._connection.recv(None if timeout is None else max(timeout, 0), decode=False)
        except TimeoutError:
            raise TimeoutError(f"nothing came on the stream within {timeout}s") from None
        except ConnectionClosed:
            return None

    def send(self, message: bytes) -> None:
        """``ConnectionError`` (an ``OSError``) once the stream is closed."""
        try:
            self._connection.send(message)
        except ConnectionClosed as e:
            raise ConnectionError("the stream is closed") from e

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close (a close frame, then the socket once answered or after ``timeout``)."""
        self._connection.close_timeout = timeout
        self._connection.close()


class _SerialTLS:
    """A client's TLS connection whose OpenSSL state one thread touches at a time.

    websockets reads on its own thread while callers write on theirs, and an OpenSSL
    connection is not safe for that: a write resets the state a concurrent read
    reports from, and the read saw a spurious end of stream (about one exec in a
    hundred). Here TLS runs over memory buffers under a lock, and only the plain TCP
    socket, which takes a reader and a writer at once, is read and written outside it.
    Only what websockets' sync connection uses is implemented; the rest is the
    socket's."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, hostname: str | None) -> None:
        self._sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=hostname)
        self._state = threading.Lock()  # the TLS object and its two buffers
        self._writing = threading.Lock()  # taken before _state: records leave in order
        while True:
            try:
                with self._state:
                    self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    raise ConnectionError(
                        "the connection closed during the TLS handshake"
                    ) from None
        self._flush()

    def _flush(self) -> None:
        with self._writing:
            with self._state:
                data = self._outgoing.read()
            if data:
                self._sock.sendall(data)

    def _fill(self) -> bool:
        data = self._sock.recv(READ_SIZE)
        with self._state:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
        return bool(data)

    def recv(self, bufsize: int) -> bytes:
        """What has come, decrypted: every whole record buffered (``bufsize`` is not a
        limit: a record left in the buffer would wait for the socket to be readable
        again); b"" at the end."""
        while True:
            chunks = []
            ended = False
            with self._state:
                try:
                    while chunk := self._tls.read(READ_SIZE):
                        chunks.append(chunk)
                    ended = True  # a close_notify
                except ssl.SSLWantReadError:
                    pass
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    ended = True
                answer = self._outgoing.pending > 0  # a reply a record asked for
            if answer:
                self._flush()
            if chunks or ended:
                return b"".join(chunks)
            self._fill()

    def sendall(self, data: bytes) -> None:
        with self._writing:
            with self._state:
                with memoryview(data) as view:
                    sent = 0
                    while sent < len(view):
                        sent += self._tls.write(view[sent:])
                records = self._outgoing.read()
            self._sock.sendall(records)

    def send(self, data: bytes) -> int:
        self.sendall(data)
        return len(data)

    def close(self) -> None:
        # A shutdown first: a close alone leaves a read blocked on another thread waiting.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Connect(reconnect):
    """websockets' connect, its TLS one thread at a time (``_SerialTLS``)."""

    def enable_tls(self, sock: socket.socket, deadline: Deadline) -> socket.socket:
        context = self.ssl or ssl.create_default_context()
        sock.settimeout(deadline.timeout())
        tls = _SerialTLS(sock, context, self.server_hostname or self.ws_uri.host)
        sock.settimeout(None)
        return cast(socket.socket, tls)


def open_stream(api: client.ApiClient, path: str) -> Stream:
    """A connected WebSocket to ``path`` (with its query) on the API server;
    ``StreamRefused`` on an HTTP answer instead of the upgrade."""
    cfg = api.configuration
    # Its token first: reading it runs the kubeconfig's refresh hook (an exec
    # plugin's token, fresh), which may also change the TLS files read below.
    headers = _auth_headers(cfg)
    url = "ws" + cfg.host.removeprefix("http") + path
    try:
        connection = _Connect(
            url,
            ssl=_tls(cfg),
            server_hostname=cfg.tls_server_name or None,
            additional_headers=headers,
            subprotocols=[Subprotocol(SUBPROTOCOL)],
            compression=None,
            # The kubeconfig's proxy, as the API client's; never the environment's.
            proxy=cfg.proxy or None,
            open_timeout=CONNECT_TIMEOUT,
            ping_interval=None,  # an idle stream is the gateway's to time out
            close_timeout=CLOSE_TIMEOUT,
            max_size=None,
            max_queue=None,  # the reading thread never stops for a caller busy sending
        ).connect()
    except InvalidStatus as e:
        raise StreamRefused(e.response.status_code, _refusal_message(e.response.body)) from None
    connection.pending_legacy_warning = False  # one connection, closed by its Stream
    return Stream(connection)


__all__ = ["Stream", "StreamRefused", "check_sandbox", "is_forbidden", "open_stream"]
