"""The CLI's side of ``sandlot logs`` / ``sandlot exec``: a WebSocket to the
sandbox's ``log`` or ``exec`` subresource on the API server.

Like ``kubectl exec``, it talks to the API server alone, with the kubeconfig's
own identity (a token or a client certificate): the API server authenticates it
and hands the stream to sandlot's gateway with the user's name, never the
credential. Nothing the CLI reads tells it where a node is.
"""

from __future__ import annotations

import json
import ssl
from typing import Any
from urllib.parse import urlsplit

import websocket
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects
from sandlot.api.errors import UsageError
from sandlot.policy.streams import SUBPROTOCOL

CONNECT_TIMEOUT = 30.0


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
    """One open stream: binary messages in and out; ``recv`` answers None once closed."""

    def __init__(self, ws: websocket.WebSocket) -> None:
        self._ws = ws

    def recv(self, timeout: float | None = None) -> bytes | None:
        """The next message; None once closed. With ``timeout`` (seconds), a
        ``TimeoutError`` when nothing came in time (the stream is then unusable)."""
        self._ws.settimeout(None if timeout is None else max(timeout, 0.001))
        try:
            opcode, data = self._ws.recv_data()
        except websocket.WebSocketTimeoutException:
            raise TimeoutError(f"nothing came on the stream within {timeout}s") from None
        except (websocket.WebSocketConnectionClosedException, OSError):
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return None
        return data if isinstance(data, bytes) else bytes(data)

    def send(self, message: bytes) -> None:
        """``ConnectionError`` (an ``OSError``) once the stream is closed."""
        try:
            self._ws.send(message, opcode=websocket.ABNF.OPCODE_BINARY)
        except websocket.WebSocketConnectionClosedException as e:
            raise ConnectionError(f"the stream is closed: {e}") from None

    def close(self) -> None:
        self._ws.close(timeout=2)


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
    ws.settimeout(None)  # bounded by the stream: the agent ends it with the sandbox
    return Stream(ws)


__all__ = ["Stream", "StreamRefused", "check_sandbox", "is_forbidden", "open_stream"]
