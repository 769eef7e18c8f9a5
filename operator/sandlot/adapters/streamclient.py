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
import logging
import queue
import select
import socket
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

import websocket
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from sandlot.adapters.objects import Objects
from sandlot.api.errors import UsageError
from sandlot.policy.streams import SUBPROTOCOL

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0  # seconds a close waits for the other side's close frame
IO_WAIT = 1.0  # seconds the I/O thread sleeps at most between looks at its socket
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


def _auth_headers(cfg: Any) -> list[str]:
    """The kubeconfig's bearer token as a header, if it has one (a client certificate
    goes in the TLS options instead)."""
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
    return [f"Authorization: {value}"] if value else []


def _sslopt(cfg: Any) -> dict[str, Any]:
    if not cfg.host.startswith("https"):
        return {}
    if not cfg.verify_ssl:
        return {"cert_reqs": ssl.CERT_NONE, "check_hostname": False}
    opts: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED}
    if cfg.ssl_ca_cert:
        opts["ca_certs"] = cfg.ssl_ca_cert
    if cfg.cert_file:
        opts["certfile"] = cfg.cert_file
        opts["keyfile"] = cfg.key_file
    if cfg.tls_server_name:
        opts["server_hostname"] = cfg.tls_server_name
    return opts


def _refusal_message(body: bytes | str | None) -> str:
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(parsed, dict) and parsed.get("message"):
        return str(parsed["message"])  # a metav1.Status from the API server itself
    return text.strip()


def _proxy(cfg: Any) -> dict[str, Any]:
    """The kubeconfig's proxy, as the API client uses it; never one from the environment."""
    if not cfg.proxy:
        return {"http_no_proxy": ["*"]}
    proxy = urlsplit(cfg.proxy)
    return {"http_proxy_host": proxy.hostname, "http_proxy_port": proxy.port, "proxy_type": "http"}


class Stream:
    """One open stream: binary messages in and out; ``recv`` answers None once closed.

    Every read and write of the connection's socket happens on one thread of its own:
    an OpenSSL connection is not safe to read on one thread while another writes
    (a concurrent write resets the state a blocked read reports from, and the read
    saw a spurious end of stream), and callers do exactly that: a stdin or resize
    thread sends while the caller waits in ``recv``. ``send`` queues the frame and
    wakes that thread; ``recv`` takes whole messages from a queue."""

    def __init__(self, sock: socket.socket, max_size: int | None = None) -> None:
        self._sock = sock
        self._protocol = Protocol(Side.CLIENT, state=State.OPEN, max_size=max_size)
        self._lock = threading.Lock()  # the protocol and the bytes waiting to go out
        self._outgoing = bytearray()
        self._inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._ended = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        sock.setblocking(False)
        self._fragments: list[bytes] = []
        self._thread = threading.Thread(target=self._run, name="stream-io", daemon=True)
        self._thread.start()

    def recv(self, timeout: float | None = None) -> bytes | None:
        """The next message; None once closed. With ``timeout`` (seconds), a
        ``TimeoutError`` when nothing came in time."""
        try:
            message = self._inbox.get(timeout=None if timeout is None else max(timeout, 0))
        except queue.Empty:
            raise TimeoutError(f"nothing came on the stream within {timeout}s") from None
        if message is None:
            self._inbox.put(None)  # every later recv answers closed too
        return message

    def send(self, message: bytes) -> None:
        """``ConnectionError`` (an ``OSError``) once the stream is closed."""
        with self._lock:
            if self._ended.is_set() or self._protocol.state is not State.OPEN:
                raise ConnectionError("the stream is closed")
            self._protocol.send_binary(message)
            self._queue_output()
        self._wake()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close (a close frame, then the socket once answered or after ``timeout``)."""
        with self._lock:
            if not self._ended.is_set() and self._protocol.state is State.OPEN:
                self._protocol.send_close(1000)
                self._queue_output()
        self._wake()
        self._ended.wait(timeout)
        self._ended.set()
        self._wake()
        self._thread.join(timeout)
        for sock in (self._sock, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()

    # -- the I/O thread -----------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _queue_output(self) -> None:
        """Called with the lock held: what the protocol has to send, onto the queue."""
        for data in self._protocol.data_to_send():
            self._outgoing += data

    def _run(self) -> None:
        try:
            while not self._ended.is_set():
                with self._lock:
                    writing = bool(self._outgoing)
                pending = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0
                if not pending:
                    readable, _, _ = select.select(
                        [self._sock, self._wake_r], [self._sock] if writing else [], [], IO_WAIT
                    )
                    if self._wake_r in readable:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                if not self._flush() or not self._read():
                    return
        except OSError as e:
            log.debug("stream ended: %s", e)
        finally:
            self._ended.set()
            self._inbox.put(None)

    def _flush(self) -> bool:
        """Write what is queued, as far as the socket takes it; False once the
        protocol is done writing (the close handshake ended)."""
        with self._lock:
            data = bytes(self._outgoing)
        sent = 0
        while sent < len(data):
            try:
                sent += self._sock.send(data[sent:])
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                break
        with self._lock:
            del self._outgoing[:sent]
            return not (self._protocol.state is State.CLOSED and not self._outgoing)

    def _read(self) -> bool:
        """Read what has come and hand whole messages to ``recv``; False at the end."""
        while True:
            try:
                data = self._sock.recv(READ_SIZE)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return True
            with self._lock:
                if data:
                    self._protocol.receive_data(data)
                else:
                    self._protocol.receive_eof()
                events = self._protocol.events_received()
                self._queue_output()
            for event in events:
                if isinstance(event, Frame):
                    self._deliver(event)
            if not data or self._protocol.state is State.CLOSED:
                self._flush()
                return False

    def _deliver(self, frame: Frame) -> None:
        if frame.opcode in (Opcode.BINARY, Opcode.TEXT, Opcode.CONT):
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                self._inbox.put(b"".join(self._fragments))
                self._fragments = []
        elif frame.opcode is Opcode.CLOSE:
            self._inbox.put(None)


def open_stream(api: client.ApiClient, path: str) -> Stream:
    """A connected WebSocket to ``path`` (with its query) on the API server;
    ``StreamRefused`` on an HTTP answer instead of the upgrade."""
    cfg = api.configuration
    if cfg.refresh_api_key_hook is not None:
        cfg.refresh_api_key_hook(cfg)  # an exec plugin's token, fresh
    url = "ws" + cfg.host.removeprefix("http") + path
    try:
        ws = websocket.create_connection(
            url,
            header=_auth_headers(cfg),
            subprotocols=[SUBPROTOCOL],
            sslopt=_sslopt(cfg),
            timeout=CONNECT_TIMEOUT,
            enable_multithread=True,
            skip_utf8_validation=True,
            **_proxy(cfg),
        )
    except websocket.WebSocketBadStatusException as e:
        raise StreamRefused(e.status_code, _refusal_message(e.resp_body)) from None
    # The handshake is websocket-client's; the open connection is the Stream's alone.
    if ws.sock is None:
        raise ConnectionError(f"the stream to {path} closed during its upgrade")
    return Stream(ws.sock)


__all__ = ["Stream", "StreamRefused", "check_sandbox", "is_forbidden", "open_stream"]
