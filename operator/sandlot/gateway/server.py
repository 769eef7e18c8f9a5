"""The stream gateway: ``sandboxes/log`` and ``sandboxes/exec`` of the aggregated API
``subresources.sandlot.dev``, served to the API server and relayed to the agents.

Why a program of its own, not a part of the operator: it serves every replica at
once (no leadership), its load is the users' streams (bytes, connections), not the
fleet's objects, and a flood of sessions must never slow the leader's marking.

One request, in order, before anything reaches a node:

1. the connection's client certificate is the API server's front proxy (the TLS
   handshake checked the CA; ``policy.streams.caller_of`` the allowed names), so
   the user named in its headers is believed; nobody else's headers are;
2. a SubjectAccessReview for that user, made under the gateway's own identity
   (an allow of exactly the same question is reused a few seconds:
   ``gateway.reviews``);
3. the session caps: per replica, per user, per ServiceAccount namespace;
4. the sandbox's node from the Sandbox itself, and that node's agent pod from the
   pods bound to it (``adapters.agentpods``; both remembered a few seconds,
   ``gateway.placements``); nothing a node writes is read;
5. a WebSocket to that agent over mutual TLS: the gateway's client certificate,
   the agent's serving certificate checked against the stream CA and name.

Only then does the user's upgrade complete, and messages are relayed both ways
until either side ends, or until nothing has moved either way for ``idle_timeout``
(the agent ends its own quiet streams sooner; this bounds a relay whose agent
never does), which closes both sides and frees the stream's caps. A refusal at
any step is an HTTP answer naming why (the agent's own refusals, such as a
sandbox not Running, pass through unchanged).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import Server, ServerConnection
from websockets.typing import Subprotocol

from sandlot.adapters.mtls import peer_common_name, peer_dns_names
from sandlot.adapters.startup import setting_name
from sandlot.adapters.streamlisten import (
    CLOSE_TIMEOUT,
    MAX_MESSAGE,
    TlsListener,
    listen_for_streams,
)
from sandlot.policy.agentcerts import agent_server_name, certified_node
from sandlot.policy.sessioncaps import (
    SessionCaps,
    SessionCounts,
    give_back_session,
    take_session,
)
from sandlot.policy.streamaccess import (
    Caller,
    RequestHeaderConfig,
    access_review_spec,
    api_group,
    api_group_list,
    api_resource_list,
    caller_of,
    decide_access,
)
from sandlot.policy.streams import (
    API_PREFIX,
    CALLER_HEADER,
    OPEN_TIMEOUT_HEADER,
    STATUS,
    STREAM_ID_HEADER,
    STREAM_OPTIONS_HEADER,
    SUBPROTOCOL,
    SUBRESOURCE_GROUP,
    StreamRequest,
    StreamRequestError,
    agent_request,
    parse_api_request,
)

log = logging.getLogger(__name__)

END = bytes([STATUS])  # a status frame's first byte

DISCOVERY: dict[str, Callable[[], dict[str, Any]]] = {
    "/apis": api_group_list,
    f"/apis/{SUBRESOURCE_GROUP}": api_group,
    API_PREFIX: api_resource_list,
}


class Refusal(Exception):
    """An answer instead of the upgrade: an HTTP status and why. ``detail`` (internal
    addresses, the error underneath) goes to the gateway's log, never to the user."""

    def __init__(self, status: int, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail


class AgentConnection(ClientConnection):
    """A connection to an agent that notes the names its certificate gives before its
    reading thread starts: a stream that ends at once (a quick command's status, then
    the agent's close) has its socket closed by that thread, and a certificate read
    after that finds none."""

    def __init__(self, socket: Any, protocol: Any, **kwargs: Any) -> None:
        self.peer_names = peer_dns_names(socket)  # the TLS handshake is done by now
        super().__init__(socket, protocol, **kwargs)


class Unanswered(Refusal):
    """The agent took the connection and never answered the upgrade: lost before its
    answer, or an answer that is not one. Tried once more, under the same stream id."""


@dataclass(frozen=True)
class Backends:
    """What the gateway asks of the cluster, each call bounded by its caller."""

    review: Callable[[Mapping[str, Any]], Mapping[str, Any]]  # SubjectAccessReview status
    node_of: Callable[[str, str], str]  # (namespace, name) -> spec.nodeName; Refusal if none
    agent_of: Callable[[str], tuple[str, int]]  # node -> (agent pod IP, port); Refusal if none
    # Forget what node_of and agent_of remembered of the sandbox (namespace, name);
    # whether anything was (``gateway.placements``).
    forget: Callable[[str, str], bool] = lambda namespace, name: False


class Sessions:
    """Open streams, capped per replica, per user, per ServiceAccount namespace and
    per group (``policy.sessioncaps``); ``take`` refuses past any."""

    def __init__(
        self,
        total: int,
        per_user: int,
        per_namespace: int | None = None,
        per_group: int | None = None,
    ) -> None:
        self.caps = SessionCaps(total, per_user, per_namespace or total, per_group)
        self._lock = threading.Lock()
        self._counts = SessionCounts()

    @property
    def open(self) -> int:
        with self._lock:
            return self._counts.open

    def take(self, user: str, groups: tuple[str, ...] = ()) -> None:
        with self._lock:
            self._counts, refused = take_session(self.caps, self._counts, user, groups)
        if refused is not None:
            raise Refusal(429, refused)

    def give_back(self, user: str, groups: tuple[str, ...] = ()) -> None:
        with self._lock:
            self._counts = give_back_session(self._counts, user, groups)


@dataclass
class _Opened:
    agent: ClientConnection
    user: str
    kind: str
    groups: tuple[str, ...] = ()


def _not_certified(node: str) -> str:
    return (
        f"the agent reached for node {node} is not certified for node {node} by "
        "sandlot's agent CA: refused"
    )


class Gateway(TlsListener[Server]):
    """``start()`` listens; ``shutdown()`` ends it and every open stream."""

    listening_as = "the gateway"

    def __init__(
        self,
        *,
        bind: str,
        port: int,
        server_tls: ssl.SSLContext,
        agent_tls: ssl.SSLContext,
        requestheader: Callable[[], RequestHeaderConfig],
        backends: Backends,
        sessions: Sessions,
        call_timeout: float,
        idle_timeout: float = 900.0,
        on_stream: Callable[[str, str], None] = lambda kind, outcome: None,
    ) -> None:
        super().__init__(bind=bind, port=port, server_tls=server_tls)
        self._agent_tls = agent_tls
        self._requestheader = requestheader
        self._backends = backends
        self.sessions = sessions
        self.call_timeout = call_timeout
        self.idle_timeout = idle_timeout
        self._on_stream = on_stream
        self._opened: dict[int, _Opened] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        self._server = listen_for_streams(
            self._relay,
            bind=self.bind,
            port=self.requested_port,
            tls=self._server_tls,
            open_timeout=self.call_timeout,
            process_request=self._admit,
            process_response=self._answered,
            create_connection=self._connection_class(),
            settings=f"{setting_name('port')} / {setting_name('bind')}",
            thread="gateway",
        )
        log.info("stream gateway listening on %s:%d", self.bind or "*", self.port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        with self._lock:
            opened = list(self._opened.values())
            self._opened.clear()
        for one in opened:
            one.agent.close()

    # -- what the router (gateway.router) shares: the same checks, the same agents ----

    def requestheader(self) -> RequestHeaderConfig:
        return self._requestheader()

    def from_front_proxy_name(self, name: str) -> bool:
        allowed = self._requestheader().allowed_names
        return bool(name) and (not allowed or name in allowed)

    def authorize(self, caller: Caller | None, asked: StreamRequest) -> None:
        """The review a stream of ``asked`` passes; ``Refusal`` when it does not."""
        self._allow(caller, asked)

    def open_agent(self, asked: StreamRequest, user: str) -> ClientConnection:
        """The agent's side of ``asked``, opened as a stream's is; ``Refusal`` if not."""
        return self._open_agent(asked, user)

    # -- before the upgrade ----------------------------------------------------------

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0].rstrip("/")
        caller = caller_of(
            request.headers.raw_items(),
            self._requestheader(),
            peer_common_name(connection.socket),
        )
        if path in DISCOVERY:
            if caller is None and not self._from_front_proxy(connection):
                return _answer(401, "only the API server's front proxy may ask\n")
            return _json(DISCOVERY[path]())
        kind = "unknown"
        try:
            asked = parse_api_request(request.path)
            kind = asked.kind
            self._allow(caller, asked)
            user = caller.user if caller else ""
            groups = caller.groups if caller else ()
            self.sessions.take(user, groups)
            try:
                agent = self._open_agent(asked, user)
            except BaseException:
                self.sessions.give_back(user, groups)
                raise
        except StreamRequestError as e:
            self._on_stream(kind, "bad_request")
            return _answer(400, f"{e}\n")
        except Refusal as e:
            self._on_stream(kind, f"refused_{e.status}")
            # A 5xx is the gateway's or an agent's failure, not the caller's: a warning.
            log.log(
                logging.WARNING if e.status >= 500 else logging.INFO,
                "stream refused (%d): %s%s",
                e.status,
                e.message,
                e.detail and f" ({e.detail})",
            )
            return _answer(e.status, f"{e.message}\n")
        with self._lock:
            self._opened[id(connection)] = _Opened(agent, user, kind, groups)
        self._on_stream(kind, "opened")
        return None

    def _from_front_proxy(self, connection: ServerConnection) -> bool:
        allowed = self._requestheader().allowed_names
        name = peer_common_name(connection.socket)
        return bool(name) and (not allowed or name in allowed)

    def _allow(self, caller: Caller | None, asked: StreamRequest) -> None:
        status = None
        if caller is not None:
            try:
                status = self._backends.review(access_review_spec(caller, asked))
            except Exception as e:
                raise Refusal(503, "the gateway cannot review the request", str(e)) from None
        access = decide_access(caller, status, asked)
        if not access.allowed:
            raise Refusal(access.code, access.message)
        log.info("stream allowed: %s", access.message)

    def _open_agent(self, asked: StreamRequest, user: str) -> ClientConnection:
        # One id for both tries: an agent that took the first runs the stream once and
        # refuses the second (409), so a command never runs twice.
        stream_id = uuid.uuid4().hex
        try:
            return self._dial(asked, user, stream_id)
        except Refusal as e:
            # Unreachable, another node's agent at that address, or not the sandbox's
            # node: what was remembered of where it is may be out of date.
            moved = e.status in (404, 502) and self._backends.forget(asked.namespace, asked.name)
            if not (moved or isinstance(e, Unanswered)):
                raise
            if isinstance(e, Unanswered):
                log.warning("%s (%s): trying once more", e.message, e.detail)
        return self._dial(asked, user, stream_id)

    def _dial(self, asked: StreamRequest, user: str, stream_id: str) -> ClientConnection:
        node = self._backends.node_of(asked.namespace, asked.name)
        ip, port = self._backends.agent_of(node)
        host = f"[{ip}]" if ":" in ip else ip
        path, options = agent_request(asked)
        try:
            agent = connect(
                f"wss://{host}:{port}{path}",
                ssl=self._agent_tls,
                # The sandbox's node, as the gateway resolved it: an agent certified
                # for any other node fails the handshake before the request is sent.
                server_hostname=agent_server_name(node),
                additional_headers={
                    STREAM_OPTIONS_HEADER: options,
                    CALLER_HEADER: user,
                    OPEN_TIMEOUT_HEADER: f"{self.call_timeout:g}",  # the agent answers within it
                    STREAM_ID_HEADER: stream_id,
                },
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                compression=None,
                max_size=MAX_MESSAGE,
                open_timeout=self.call_timeout,
                close_timeout=CLOSE_TIMEOUT,
                proxy=None,
                create_connection=AgentConnection,
                legacy=True,  # one connection, closed by the relay; never reconnected
            )
            # The handshake checked the name already; the pure rule says it again, so
            # a context ever built without name checks still never relays to it.
            names = cast(AgentConnection, agent).peer_names
            if certified_node(names) != node:
                agent.close()
                raise Refusal(502, _not_certified(node), f"{host}:{port}: names {names}")
            return agent
        except Refusal:
            raise
        except InvalidStatus as e:  # the agent's own refusal: pass it on as it is
            body = e.response.body.decode(errors="replace").strip()
            raise Refusal(e.response.status_code, body or f"node {node}'s agent refused") from None
        except ssl.SSLCertVerificationError as e:
            raise Refusal(502, _not_certified(node), f"{host}:{port}: {e.verify_message}") from None
        except (OSError, TimeoutError, ssl.SSLError) as e:
            raise Refusal(
                502, f"cannot reach the agent of node {node}", f"{host}:{port}: {e}"
            ) from None
        except Exception as e:
            raise Unanswered(
                502, f"the agent of node {node} failed the upgrade", f"{host}:{port}: {e!r}"
            ) from None

    def _answered(
        self, connection: ServerConnection, request: Request, response: Response
    ) -> Response | None:
        if response.status_code != 101:  # the user's side did not upgrade after all
            self._release(connection)
        return None

    def _release(self, connection: ServerConnection) -> _Opened | None:
        with self._lock:
            one = self._opened.pop(id(connection), None)
        return self._let_go(one)

    def _let_go(self, one: _Opened | None) -> _Opened | None:
        if one is not None:
            one.agent.close()
            self.sessions.give_back(one.user, one.groups)
        return one

    def _connection_class(self) -> type[ServerConnection]:
        """Connections that give their session back when their socket closes, unless
        a relay serves them (its end does): a user gone while the agent was reached
        leaves no session and no agent connection behind."""
        gateway = self

        class SessionConnection(ServerConnection):
            relaying = False

            def close_socket(self) -> None:
                super().close_socket()
                with gateway._lock:
                    if self.relaying:
                        return
                    one = gateway._opened.pop(id(self), None)
                gateway._let_go(one)

        return SessionConnection

    # -- after the upgrade -------------------------------------------------------------

    def _relay(self, connection: ServerConnection) -> None:
        with self._lock:
            one = self._opened.get(id(connection))
            if one is not None:
                connection.relaying = True  # type: ignore[attr-defined]  # a SessionConnection
        if one is None:  # it ended before it was relayed: its session is given back
            connection.close()
            return
        agent = one.agent
        last_moved = time.monotonic()  # either way; read and written without a lock

        def user_to_agent() -> None:
            nonlocal last_moved
            try:
                for message in connection:
                    last_moved = time.monotonic()
                    agent.send(message)
            except ConnectionClosed:
                pass
            finally:
                agent.close()

        upstream = threading.Thread(target=user_to_agent, name="gateway-up", daemon=True)
        upstream.start()
        try:
            while True:
                quiet = time.monotonic() - last_moved
                if quiet >= self.idle_timeout:
                    log.info("stream idle for %gs: the gateway ends it", self.idle_timeout)
                    self._on_stream(one.kind, "idle")
                    reason = f"nothing moved for {self.idle_timeout:g}s (idle_timeout)"
                    agent.close(1000, reason)
                    connection.close(1000, reason)
                    break
                try:
                    message = agent.recv(timeout=self.idle_timeout - quiet)
                except TimeoutError:
                    continue  # the user may have sent meanwhile: look again
                last_moved = time.monotonic()
                connection.send(message)
                if isinstance(message, bytes) and message[:1] == END:
                    # The agent's last frame of every stream (it closes right after):
                    # the user's side is closed now, not after the agent's close
                    # handshake has come back.
                    break
        except ConnectionClosed:
            pass
        finally:
            connection.close()
            upstream.join(CLOSE_TIMEOUT * 2)
            self._release(connection)


def _answer(status: int, text: str) -> Response:
    return _response(status, text.encode(), "text/plain; charset=utf-8")


def _json(body: Mapping[str, Any]) -> Response:
    return _response(200, json.dumps(body).encode(), "application/json")


def _response(status: int, body: bytes, content_type: str) -> Response:
    from http import HTTPStatus

    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
    )
    return Response(status, HTTPStatus(status).phrase, headers, body)


__all__ = ["Backends", "Gateway", "Refusal", "Sessions"]
