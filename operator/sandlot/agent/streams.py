"""The agent's stream server: ``sandlot logs`` and ``sandlot exec`` for its node.

A WebSocket server (``v5.channel.k8s.io`` frames, ``policy.streams``) on
``stream_port``, reached only through the API server's proxy (``stream_route``:
the agent's pod in a cluster, a Service of the node's agent on the local control
plane), never by the node's address. Before the upgrade every request is
authenticated and authorized (TokenReview, then SubjectAccessReview for the
reviewed identity; ``policy.streams.decide_access``) and its sandbox must run
on this node; a refusal is a plain HTTP answer (401, 403, 404, 409) whose body
says why, which the API server hands back to the CLI unchanged. Each accepted
connection has a thread of its own; the agent stopping ends them within a wait.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from websockets.sync.server import Server, ServerConnection, serve

from sandlot.adapters.containerd.execs import Execs, open_execs
from sandlot.adapters.reviews import review_access, review_token
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.adapters.startup import api_error_line, cannot_listen, setting_name
from sandlot.agent.execsession import ExecSession
from sandlot.agent.logstream import ClientGone, stream_log
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.settings import AgentSettings
from sandlot.policy.streams import (
    EXEC,
    STATUS,
    STREAM_OPTIONS_HEADER,
    STREAM_TOKEN_HEADER,
    SUBPROTOCOL,
    StreamRequest,
    StreamRequestError,
    access_review_spec,
    bearer_token,
    decide_access,
    encode_frame,
    exit_status,
    parse_stream_request,
    proxy_path,
)

log = logging.getLogger(__name__)

MAX_MESSAGE = 1 << 20
CLOSE_TIMEOUT = 2.0  # seconds a closing connection waits for the client's side


class StreamServer:
    """Serves this node's sandboxes' logs and execs; ``start()`` binds, ``shutdown()`` ends."""

    def __init__(
        self,
        api: Any,
        node: str,
        *,
        bind: str,
        port: int,
        sandbox: Callable[[str], Mapping[str, Any] | None],
        log_dir: str,
        execs: Execs | None,
        call_timeout: float,
        stop: threading.Event,
    ) -> None:
        self.api = api
        self.node = node
        self.bind = bind
        self.requested_port = port
        self._sandbox = sandbox
        self.log_dir = Path(log_dir) if log_dir else None
        self._execs = execs
        self.call_timeout = call_timeout
        self._stop = stop
        self._server: Server | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stream server is not listening")
        return int(self._server.socket.getsockname()[1])

    def start(self) -> None:
        try:
            self._server = serve(
                self._session,
                self.bind or None,
                self.requested_port,
                process_request=self._admit,
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                compression=None,
                max_size=MAX_MESSAGE,
                close_timeout=CLOSE_TIMEOUT,
            )
        except OSError as e:
            settings = f"{setting_name('stream_port')} / {setting_name('stream_bind')}"
            where = f"{self.bind or '*'}:{self.requested_port}"
            raise cannot_listen(settings, where, e) from None
        threading.Thread(target=self._server.serve_forever, name="streams", daemon=True).start()
        log.info("stream server listening on %s:%d", self.bind or "*", self.port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        if self._execs is not None:
            self._execs.close()

    # -- before the upgrade: who, may they, and is the sandbox here -----------------

    def _admit(self, connection: ServerConnection, request: Any) -> Any:
        try:
            asked = parse_stream_request(
                request.path, request.headers.get(STREAM_OPTIONS_HEADER, "")
            )
        except StreamRequestError as e:
            return connection.respond(400, f"{e}\n")
        token = bearer_token(request.headers.get(STREAM_TOKEN_HEADER))
        token_status = access_status = None
        try:
            if token:
                token_status = review_token(self.api, token, timeout=self.call_timeout)
            if token_status and token_status.get("authenticated"):
                spec = access_review_spec(token_status.get("user") or {}, asked)
                access_status = review_access(self.api, spec, timeout=self.call_timeout)
        except Exception as e:
            log.warning("cannot review a stream request: %s", api_error_line(e))
            return connection.respond(
                503, f"the agent cannot review the request: {api_error_line(e)}\n"
            )
        access = decide_access(token, token_status, access_status, asked)
        if not access.allowed:
            log.info("stream refused (%d): %s", access.code, access.message)
            return connection.respond(access.code, f"{access.message}\n")
        refusal = self._sandbox_refusal(asked)
        if refusal is not None:
            return connection.respond(*refusal)
        log.info("stream accepted: %s (%s)", access.message, request.path)
        return None

    def _sandbox_refusal(self, asked: StreamRequest) -> tuple[int, str] | None:
        key = f"{asked.namespace}/{asked.name}"
        sandbox = self._sandbox(key)
        if sandbox is None:
            return 404, f"sandbox {key} is not on node {self.node}\n"
        phase = (sandbox.get("status") or {}).get("phase")
        if asked.kind == EXEC:
            if phase != "Running":
                return 409, f"sandbox {key} is {phase or 'not started'}: exec needs it Running\n"
            if self._execs is None:
                return 501, f"node {self.node} cannot exec: its runtime has no exec\n"
            return None
        path = self._log_path(sandbox)
        if path is None or not path.exists():
            return 404, f"sandbox {key} has no log on node {self.node} (phase {phase})\n"
        return None

    def _log_path(self, sandbox: Mapping[str, Any]) -> Path | None:
        meta = sandbox.get("metadata") or {}
        if self.log_dir is None:
            return None
        return self.log_dir / f"{meta.get('namespace')}_{meta.get('name')}_{meta.get('uid')}.log"

    # -- after the upgrade ---------------------------------------------------------------

    def _session(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None, "a session starts after its request was admitted"
        asked = parse_stream_request(request.path, request.headers.get(STREAM_OPTIONS_HEADER, ""))
        key = f"{asked.namespace}/{asked.name}"
        sandbox = self._sandbox(key) or {}
        if asked.kind == EXEC:
            execs = self._execs
            uid = str((sandbox.get("metadata") or {}).get("uid") or "")
            container = (sandbox.get("status") or {}).get("containerId") or container_id_for(uid)
            if execs is not None:
                ExecSession(
                    connection,
                    execs,
                    container,
                    asked,
                    call_timeout=self.call_timeout,
                    stopping=self._stop.is_set,
                ).run()
            return
        self._send_log(connection, asked, sandbox)

    def _send_log(
        self, connection: ServerConnection, asked: StreamRequest, sandbox: Mapping[str, Any]
    ) -> None:
        key = f"{asked.namespace}/{asked.name}"
        uid = (sandbox.get("metadata") or {}).get("uid")

        def running() -> bool:
            current = self._sandbox(key) or {}
            same = (current.get("metadata") or {}).get("uid") == uid
            return same and (current.get("status") or {}).get("phase") == "Running"

        def wait(seconds: float) -> None:
            try:
                connection.recv(timeout=seconds)
            except TimeoutError:
                return
            except Exception as e:  # closed: nobody is reading any more
                raise ClientGone(str(e)) from e

        path = self._log_path(sandbox)
        try:
            if path is not None:
                stream_log(
                    path,
                    tail=asked.tail,
                    follow=asked.follow,
                    running=running,
                    send=connection.send,
                    wait=wait,
                    stopping=self._stop.is_set,
                )
            connection.send(encode_frame(STATUS, exit_status(0)))
        except (ClientGone, FileNotFoundError):
            pass
        except Exception as e:
            log.debug("log stream of %s ended: %s", key, e)
        finally:
            connection.close()


def start_streams(
    settings: AgentSettings, api: Any, sandboxes: WatchCache, stop: threading.Event
) -> StreamServer | None:
    """The stream server of ``settings``, listening; None when it is off. Started
    first in the start-up, so a busy port fails it at once; until the sandbox watch
    has listed, every sandbox is answered as not on this node (404)."""
    if not settings.stream_port:
        return None
    server = StreamServer(
        api,
        settings.node_name,
        bind=settings.stream_bind,
        port=settings.stream_port,
        sandbox=sandboxes.get,
        log_dir=settings.log_dir,
        execs=open_execs(settings.containerd_address, settings.containerd_namespace),
        call_timeout=settings.call_timeout.total_seconds(),
        stop=stop,
    )
    server.start()
    return server


def stream_status(settings: AgentSettings) -> dict[str, str]:
    """The SandboxNode status naming the path to this agent's stream server, if offered."""
    if not (settings.stream_port and settings.stream_pod):
        return {}
    return {"streamPath": proxy_path(settings.namespace, settings.stream_pod, settings.stream_port)}


__all__ = ["StreamServer", "start_streams", "stream_status"]
