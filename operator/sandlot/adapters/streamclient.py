"""The CLI's side of ``sandlot logs`` / ``sandlot exec``: a WebSocket to the
sandbox's node agent, through the API server.

The path comes from the agent's SandboxNode (``status.streamPath``, the
pods/proxy of its pod): the API server authenticates the caller, checks that it
may use that proxy, and passes the connection on, upgrade included. It removes
the ``Authorization`` header on the way, so the same bearer token also goes in
``policy.streams.STREAM_TOKEN_HEADER`` for the agent to review. Only a bearer
token can be passed on: a kubeconfig user with a client certificate is told so.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import websocket
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandlot.adapters.objects import Objects
from sandlot.api.errors import UsageError
from sandlot.policy.streams import STREAM_OPTIONS_HEADER, STREAM_TOKEN_HEADER, SUBPROTOCOL

CONNECT_TIMEOUT = 30.0


class StreamRefused(Exception):
    """The API server or the agent answered the upgrade with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str
    node: str
    phase: str
    stream_path: str


def find_target(api: client.ApiClient, namespace: str, name: str) -> Target:
    """Where the sandbox runs and the API server path to its node's agent."""
    objects = Objects(api)
    try:
        sandbox = objects.get_sandbox(namespace, name)
    except ApiException as e:
        if e.status == 404:
            raise UsageError(f'sandbox "{name}" not found in namespace {namespace}') from None
        raise
    phase = str((sandbox.get("status") or {}).get("phase") or "Pending")
    node = str((sandbox.get("spec") or {}).get("nodeName") or "")
    if not node:
        raise UsageError(f'sandbox "{name}" is {phase} and not on any node yet')
    snode = objects.get_node(node) or {}
    path = str((snode.get("status") or {}).get("streamPath") or "")
    if not path:
        raise UsageError(
            f'node {node} of sandbox "{name}" offers no logs or exec: its agent runs '
            "without --stream-port / --stream-pod"
        )
    return Target(namespace, name, node, phase, path)


def is_forbidden(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status in (401, 403)


def bearer_of(api: client.ApiClient) -> str:
    cfg = api.configuration
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise UsageError(
            "logs and exec need a bearer-token identity (the API server does not pass a "
            "client certificate on to the agent): use a kubeconfig user with a token"
        )
    return token


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

    def recv(self) -> bytes | None:
        try:
            opcode, data = self._ws.recv_data()
        except (websocket.WebSocketConnectionClosedException, OSError):
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return None
        return data if isinstance(data, bytes) else bytes(data)

    def send(self, message: bytes) -> None:
        self._ws.send(message, opcode=websocket.ABNF.OPCODE_BINARY)

    def close(self) -> None:
        self._ws.close(timeout=2)


def open_stream(api: client.ApiClient, path: str, options: str = "") -> Stream:
    """A connected WebSocket to ``path`` on the API server; ``StreamRefused`` on an
    HTTP answer instead of the upgrade."""
    cfg = api.configuration
    token = bearer_of(api)
    url = "ws" + cfg.host.removeprefix("http") + path
    headers = [
        f"Authorization: Bearer {token}",
        f"{STREAM_TOKEN_HEADER}: Bearer {token}",
        f"{STREAM_OPTIONS_HEADER}: {options}",
    ]
    try:
        ws = websocket.create_connection(
            url,
            header=headers,
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


__all__ = [
    "Stream",
    "StreamRefused",
    "Target",
    "bearer_of",
    "find_target",
    "is_forbidden",
    "open_stream",
]
