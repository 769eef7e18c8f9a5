"""The agent's stream server: ``sandlot logs`` and ``sandlot exec`` for its node.

A WebSocket server (``v5.channel.k8s.io`` frames, ``policy.streams``) on
``stream_port`` that speaks only mutual TLS and serves only sandlot's stream
gateway: a client certificate of the stream CA whose common name is one of
``stream_client_name``. The gateway has authenticated and authorized the user
before it connects; the agent never sees, asks for or reviews a user's
credential, and another node's agent certificate is refused like any stranger.
Before the upgrade the sandbox must be on this node; a refusal is a plain HTTP
answer (403, 404, 409) whose body says why, which the gateway hands back to the
user. Each accepted connection has a thread of its own; the agent stopping ends
them within a wait, and so does ``idle`` seconds in which nothing moved (an exec
with no input or output, a log follow with no output, a file write or a
port-forward with no data from the client). Each admitted connection holds one
of the node's slots until it ends, however it ends, and a sandbox's slots hold
off its suspension, which holds off new ones (``policy.streamslots``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from websockets.protocol import State
from websockets.sync.server import Server, ServerConnection

from sandlot.adapters.containerd.execs import Execs, open_execs
from sandlot.adapters.mtls import ReloadingTls, peer_common_name, server_context
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.adapters.startup import StartupError, setting_name
from sandlot.adapters.streamlisten import TlsListener, listen_for_streams
from sandlot.agent.containerfiles import ContainerPort, ContainerRoot
from sandlot.agent.execsession import ExecSession, idle_past
from sandlot.agent.executors import Executors
from sandlot.agent.filesessions import Root, serve_files, serve_port
from sandlot.agent.logstream import ClientGone, stream_log
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.settings import AgentSettings
from sandlot.agent.streamcert import StreamIdentity
from sandlot.agent.toolfiles import ToolRoot
from sandlot.agent.uses import MAX_SESSIONS, SandboxUses
from sandlot.api.common import join_key, key_of
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.idle import restores_for_stream, thaws_for_stream
from sandlot.policy.ocispec import FILES_TOOL
from sandlot.policy.operatingmode import stream_refusal, wanted_mode
from sandlot.policy.remembered import Remembered
from sandlot.policy.streams import (
    CALLER_HEADER,
    EXEC,
    FILES,
    LOG,
    OPEN_TIMEOUT_HEADER,
    PORTFORWARD,
    STATUS,
    STREAM_ID_HEADER,
    STREAM_OPTIONS_HEADER,
    StreamRequest,
    StreamRequestError,
    encode_frame,
    error_status,
    exit_status,
    parse_agent_request,
)
from sandlot.policy.streamslots import Admission, StreamSlots, admission_wait

log = logging.getLogger(__name__)

# TLS and upgrade of one connection: long enough for a loaded node (a containerd call's
# deadline is not: the gateway, which waits longer, read a dropped socket as a failure),
# short enough that a client that stalls its handshake holds a thread only this long.
HANDSHAKE_TIMEOUT = 10.0
EXEC_FIFOS = "exec"  # under state_dir: the node's shim opens an exec's FIFOs there
# Stream ids taken, kept past any retry of their upgrade (the gateway tries once more
# at once), at most this many.
STREAM_IDS_KEPT_FOR = 60.0
STREAM_IDS_KEPT = 10_000


# (the sandbox, the stream's kind, seconds it may wait, whether its connection is gone)
# -> None once the sandbox runs, else why not.
Restorer = Callable[[Mapping[str, Any], str, float, Callable[[], bool]], str | None]
# (the sandbox, the stream's kind) -> None once a paused sandbox runs, else why not.
Thaw = Callable[[Mapping[str, Any], str], str | None]


class _FollowIdle(Exception):
    """A log follow sent nothing for the idle timeout."""


class StreamServer(TlsListener[Server]):
    """Serves this node's sandboxes' logs and execs; ``start()`` binds, ``shutdown()`` ends."""

    listening_as = "the stream server"

    def __init__(
        self,
        node: str,
        *,
        bind: str,
        port: int,
        tls: ssl.SSLContext,
        client_names: tuple[str, ...],
        sandbox: Callable[[str], Mapping[str, Any] | None],
        log_dir: str,
        execs: Execs | None,
        call_timeout: float,
        stop: threading.Event,
        file_limit: int = 256 * 2**20,
        idle: float = 600.0,
        max_sessions: int = MAX_SESSIONS,
        executors: Executors | None = None,
        uses: SandboxUses | None = None,
        wake: Thaw | None = None,
        restore: Restorer | None = None,
        paused_resume: bool = False,
        tls_files: ReloadingTls | None = None,
        identity: StreamIdentity | None = None,
    ) -> None:
        super().__init__(bind=bind, port=port, server_tls=tls)
        self.node = node
        # Each sandbox's executor, which runs its commands when it has one.
        self.executors = executors
        self.file_limit = file_limit
        self.idle = idle
        # The upgrade's deadline on this side: an admission's wait fits in it when the
        # gateway does not say its own.
        self.open_timeout = HANDSHAKE_TIMEOUT
        # The ids of the streams taken: a second upgrade with one is refused, not run.
        self._taken: Remembered[str, bool] = Remembered(STREAM_IDS_KEPT_FOR, STREAM_IDS_KEPT)
        self._taken_lock = threading.Lock()
        # The admitted connections, shared with the loops that freeze and suspend
        # sandboxes (``agent.uses``); the end of a stream into a sandbox wakes the sync.
        self.uses = uses if uses is not None else SandboxUses(max_sessions=max_sessions)
        self.max_sessions = self.uses.max_sessions
        # Thaws a paused sandbox for a stream (``agent.idle``): None once it runs, else why not.
        self.wake = wake
        # Starts an idle-suspended sandbox again and waits for it (``agent.idlewake``), at
        # most the seconds given and not once the connection is gone.
        self.restore = restore
        # A pause the spec asks for is thawed for a stream too (``paused_streams``).
        self.paused_resume = paused_resume
        # The certificate files, re-read by ``refresh_tls``, and what asks for the next
        # certificate when the current one is due (``stream_tls_request``).
        self.tls_files = tls_files
        self.identity = identity
        self.client_names = client_names
        self._sandbox = sandbox
        self.log_dir = Path(log_dir) if log_dir else None
        self._execs = execs
        self.call_timeout = call_timeout
        self._stop = stop

    def start(self) -> None:
        self._server = listen_for_streams(
            self._session,
            bind=self.bind,
            port=self.requested_port,
            tls=self._server_tls,
            open_timeout=self.open_timeout,
            process_request=self._admit,
            process_response=self._answered,
            create_connection=self._connection_class(),
            settings=f"{setting_name('stream_port')} / {setting_name('stream_bind')}",
            thread="streams",
        )
        log.info("stream server listening on %s:%d", self.bind or "*", self.port)

    def sessions(self, key: str) -> int:
        """Exec, files and port-forward sessions open into sandbox ``key``."""
        return self.uses.sessions(key)

    def in_use(self) -> frozenset[str]:
        """The sandboxes with an exec, files or port-forward session open."""
        return self.uses.in_use()

    def slots(self) -> StreamSlots:
        """The node's stream slots as they are now."""
        return self.uses.slots()

    def suspending(self, key: str) -> contextlib.AbstractContextManager[bool]:
        """Whether a suspension of ``key`` may begin (no stream uses it); while it runs,
        no stream into it is admitted."""
        return self.uses.suspending(key)

    def refresh_tls(self) -> None:
        """Take rotated certificate files into use (new connections get them), after
        asking for the next certificate when the current one is due."""
        if self.identity is not None:
            self.identity.renew_if_due()
        if self.tls_files is not None:
            self.tls_files.refresh()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        if self.executors is not None:
            self.executors.close()
        if self._execs is not None:
            self._execs.close()

    # -- before the upgrade: who, may they, and is the sandbox here -----------------

    def _admit(self, connection: ServerConnection, request: Any) -> Any:
        peer = peer_common_name(connection.socket)
        if peer not in self.client_names:
            log.warning("stream refused: client certificate %r is not the stream gateway's", peer)
            return connection.respond(403, "only the stream gateway may open streams\n")
        try:
            asked = parse_agent_request(
                request.path, request.headers.get(STREAM_OPTIONS_HEADER, "")
            )
        except StreamRequestError as e:
            return connection.respond(400, f"{e}\n")
        if not self._first_take(request.headers.get(STREAM_ID_HEADER, "")):
            return connection.respond(409, "this stream was opened already; open a new one\n")
        # Counted before the sandbox is judged (and maybe thawed): no pass freezes or
        # suspends it between the judgement and the session.
        used = None if asked.kind == LOG else join_key(asked.namespace, asked.name)
        admission = self.uses.admit(id(connection), used)
        if admission is Admission.FULL:
            log.warning("stream refused: %d streams open on this node", self.max_sessions)
            return connection.respond(
                429, f"node {self.node} has {self.max_sessions} streams open; try again\n"
            )
        if admission is Admission.SUSPENDING:
            asked_for = self._suspend_asked(used, asked.kind)
            if asked_for is not None:  # its spec asks for it: not "in a moment"
                return connection.respond(409, f"{asked_for}\n")
            return connection.respond(
                503,
                f"sandbox {used} is being suspended on node {self.node} (its files are "
                f"being committed); try the {asked.kind} again in a moment\n",
            )
        wait = admission_wait(request.headers.get(OPEN_TIMEOUT_HEADER), self.open_timeout)
        refusal = self._sandbox_refusal(asked, wait, lambda: connection.state is State.CLOSED)
        if refusal is not None:
            self._close(connection)
            return connection.respond(*refusal)
        caller = request.headers.get(CALLER_HEADER, "?")
        log.info(
            "stream accepted for %s: %s %s/%s", caller, asked.kind, asked.namespace, asked.name
        )
        return None

    def _first_take(self, stream_id: str) -> bool:
        """Whether the stream ``stream_id`` (none: a caller without ids) is opened for
        the first time: the gateway's retry of an upgrade whose answer it lost must
        never run a command twice."""
        if not stream_id:
            return True
        now = time.monotonic()
        with self._taken_lock:
            if self._taken.answer(stream_id, now):
                return False
            self._taken.remember(stream_id, True, now)
        return True

    def _suspend_asked(self, key: str | None, kind: str) -> str | None:
        """Why a stream into ``key`` is refused when its spec asks for Suspended (the
        refusal a suspended sandbox gets, given while its suspension still runs)."""
        sandbox = self._sandbox(key) if key is not None else None
        if sandbox is None or wanted_mode(sandbox) is not OperatingMode.SUSPENDED:
            return None
        return stream_refusal(sandbox, kind)

    def _answered(self, connection: ServerConnection, request: Any, response: Any) -> None:
        if response.status_code != 101:  # admitted, but the upgrade did not happen
            self._close(connection)

    def _close(self, connection: ServerConnection) -> None:
        self.uses.release(id(connection))

    def _connection_class(self) -> type[ServerConnection]:
        """Connections that free their slot when their socket closes, unless a session
        serves them (its end frees it): a peer gone during the admission or the
        upgrade frees it too, whatever the handshake does next."""
        uses = self.uses

        class SlotConnection(ServerConnection):
            serving = False

            def served(self) -> None:
                """A session serves it: its end, not its socket's, frees the slot."""
                self.serving = True

            def close_socket(self) -> None:
                super().close_socket()
                uses.release(id(self), unless=lambda: self.serving)

        return SlotConnection

    def _sandbox_refusal(
        self, asked: StreamRequest, wait: float = 0.0, gone: Callable[[], bool] = lambda: False
    ) -> tuple[int, str] | None:
        """Why ``asked`` is not served (an HTTP status and its text), or None; a restore
        it needs is waited for ``wait`` seconds at most and not once ``gone`` says its
        connection ended."""
        key = join_key(asked.namespace, asked.name)
        sandbox = self._sandbox(key)
        if sandbox is None:
            return 404, f"sandbox {key} is not on node {self.node}\n"
        phase = (sandbox.get("status") or {}).get("phase")
        if asked.kind != LOG:
            if phase != SandboxPhase.RUNNING:
                return 409, (
                    f"sandbox {key} is {phase or 'not started'}: {asked.kind} needs it Running\n"
                )
            if restores_for_stream(sandbox):
                return self._restored(sandbox, asked.kind, wait, gone)
            if thaws_for_stream(sandbox, self.paused_resume):
                return self._woken(sandbox, asked.kind)
            frozen = stream_refusal(sandbox, asked.kind)
            if frozen is not None:  # a frozen task would hang the stream until its deadline
                return 409, f"{frozen}\n"
            if self._execs is None:
                return 501, f"node {self.node} cannot {asked.kind}: its runtime has no tasks\n"
            return None
        path = self._log_path(sandbox)
        if path is None or not path.exists():
            return 404, f"sandbox {key} has no log on node {self.node} (phase {phase})\n"
        return None

    def _woken(self, sandbox: Mapping[str, Any], kind: str) -> tuple[int, str] | None:
        why = self.wake(sandbox, kind) if self.wake is not None else "no resumer on this node"
        if why is not None:
            return 409, f"{why}\n"
        return None if self._execs is not None else (501, f"node {self.node} has no tasks\n")

    def _restored(
        self, sandbox: Mapping[str, Any], kind: str, wait: float, gone: Callable[[], bool]
    ) -> tuple[int, str] | None:
        if self.restore is None:
            key = key_of(sandbox)
            return 409, f"sandbox {key} is suspended and node {self.node} cannot start it\n"
        why = self.restore(sandbox, kind, wait, gone)
        if why is not None:
            return 503, f"{why}\n"
        return None if self._execs is not None else (501, f"node {self.node} has no tasks\n")

    def _log_path(self, sandbox: Mapping[str, Any]) -> Path | None:
        meta = sandbox.get("metadata") or {}
        if self.log_dir is None:
            return None
        return self.log_dir / f"{meta.get('namespace')}_{meta.get('name')}_{meta.get('uid')}.log"

    # -- after the upgrade ---------------------------------------------------------------

    def _session(self, connection: ServerConnection) -> None:
        served = connection.served  # type: ignore[attr-defined]  # a SlotConnection
        if not self.uses.hold(id(connection), served):
            connection.close()  # it ended before it was served: its slot is free
            return
        try:
            self._serve(connection)
        finally:
            self._close(connection)

    def _serve(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None, "a session starts after its request was admitted"
        asked = parse_agent_request(request.path, request.headers.get(STREAM_OPTIONS_HEADER, ""))
        key = join_key(asked.namespace, asked.name)
        sandbox = self._sandbox(key) or {}
        uid = str((sandbox.get("metadata") or {}).get("uid") or "")
        container = (sandbox.get("status") or {}).get("containerId") or container_id_for(uid)
        if asked.kind in (FILES, PORTFORWARD):
            self._reach_in(connection, asked, container, key, uid)
            return
        if asked.kind == EXEC:
            execs = self._execs
            if execs is not None:
                ExecSession(
                    connection,
                    execs,
                    container,
                    asked,
                    call_timeout=self.call_timeout,
                    stopping=self._stop.is_set,
                    idle=self.idle,
                    executors=self.executors,
                ).run()
            return
        self._send_log(connection, asked, sandbox)

    def _reach_in(
        self, connection: ServerConnection, asked: StreamRequest, container: str, key: str, uid: str
    ) -> None:
        execs = self._execs
        assert execs is not None, "admitted only with a runtime"
        try:
            execs.task_pid(container, timeout=self.call_timeout)  # a task runs
            tool = FILES_TOOL in execs.mounts_in(container, timeout=self.call_timeout)
        except Exception as e:
            connection.send(encode_frame(STATUS, error_status(f"no running task: {e}", 409)))
            connection.close()
            return
        if asked.kind == FILES:
            serve_files(
                connection,
                asked,
                lambda: self._root(tool, container),
                limit=self.file_limit,
                idle=self.idle,
            )
            return

        def running() -> bool:
            current = self._sandbox(key) or {}
            same = (current.get("metadata") or {}).get("uid") == uid
            return same and (current.get("status") or {}).get("phase") == SandboxPhase.RUNNING

        serve_port(
            connection,
            asked,
            self._port_connector(tool, asked.port, container),
            timeout=self.call_timeout,
            idle=self.idle,
            running=running,
        )

    def _root(self, tool: bool, container: str, idle: float | None = None) -> Root:
        """The sandbox's files reached from inside it: through the files tool mounted
        in it, else (a container made before its node had the tool, or a handler
        without it) through the image's own tools. Never through the node's view of
        the task's pid, which the agent may not share (``agent.toolfiles``)."""
        execs = self._execs
        assert execs is not None, "admitted only with a runtime"
        kind = ToolRoot if tool else ContainerRoot
        quiet = self.idle if idle is None else idle
        return kind(execs, container, call_timeout=self.call_timeout, idle=quiet)

    def _port_connector(self, tool: bool, port: int, container: str) -> Callable[[], socket.socket]:
        """Loopback of the sandbox's network, reached from inside it (the files tool's
        ``connect``, else the image's ``nc``): a server bound to 127.0.0.1 is reached
        under every handler, gVisor's netstack included."""
        root = self._root(tool, container, idle=self.call_timeout)  # a write to the port
        argv = ["connect", str(port)] if tool else ["nc", "127.0.0.1", str(port)]
        return lambda: ContainerPort(root, argv)  # type: ignore[return-value]  # socket-like

    def _send_log(
        self, connection: ServerConnection, asked: StreamRequest, sandbox: Mapping[str, Any]
    ) -> None:
        key = join_key(asked.namespace, asked.name)
        uid = (sandbox.get("metadata") or {}).get("uid")

        def running() -> bool:
            current = self._sandbox(key) or {}
            same = (current.get("metadata") or {}).get("uid") == uid
            return same and (current.get("status") or {}).get("phase") == SandboxPhase.RUNNING

        last_sent = time.monotonic()

        def send(message: bytes) -> None:
            nonlocal last_sent
            connection.send(message)
            last_sent = time.monotonic()

        def wait(seconds: float) -> None:  # called only while following, between reads
            if idle_past(last_sent, time.monotonic(), self.idle):
                raise _FollowIdle
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
                    send=send,
                    wait=wait,
                    stopping=self._stop.is_set,
                )
            connection.send(encode_frame(STATUS, exit_status(0)))
        except (ClientGone, FileNotFoundError):
            pass
        except _FollowIdle:
            log.info("log follow of %s: no output for %gs, ending it", key, self.idle)
            quiet = f"no output for {self.idle:g}s: the log follow timed out"
            with contextlib.suppress(Exception):  # a client that left meanwhile
                connection.send(encode_frame(STATUS, error_status(quiet, 408)))
        except Exception as e:
            log.debug("log stream of %s ended: %s", key, e)
        finally:
            connection.close()


def stream_server(
    settings: AgentSettings,
    sandboxes: WatchCache,
    stop: threading.Event,
    *,
    uses: SandboxUses,
    wake: Thaw,
    metrics: AgentMetrics | None = None,
    api: Any = None,
) -> StreamServer | None:
    """The stream server of ``settings``, built but not listening; None when it is
    off. An unreadable certificate fails it here, a busy port when it starts; until
    the sandbox watch has listed, every sandbox is answered as not on this node
    (404). With ``stream_tls_request``, its certificate is asked of the operator
    through ``api`` first."""
    if not settings.stream_port:
        return None
    identity = None
    if settings.stream_tls_request:
        identity = StreamIdentity(api, settings)
        identity.obtain()
    try:
        tls = server_context(
            settings.stream_tls_cert, settings.stream_tls_key, settings.stream_client_ca
        )
    except (OSError, ssl.SSLError) as e:
        names = ", ".join(
            setting_name(n) for n in ("stream_tls_cert", "stream_tls_key", "stream_client_ca")
        )
        raise StartupError(f"{names}: cannot load the stream server's TLS files: {e}") from None
    execs = open_execs(
        settings.containerd_address,
        settings.containerd_namespace,
        os.path.join(settings.state_dir, EXEC_FIFOS),
    )
    call_timeout = settings.call_timeout.total_seconds()
    return StreamServer(
        settings.node_name,
        bind=settings.stream_bind,
        port=settings.stream_port,
        tls=tls,
        client_names=tuple(settings.stream_client_name),
        sandbox=sandboxes.get,
        log_dir=settings.log_dir,
        execs=execs,
        call_timeout=call_timeout,
        stop=stop,
        file_limit=settings.stream_file_max_bytes,
        idle=settings.stream_idle_timeout.total_seconds(),
        max_sessions=settings.stream_max_sessions,
        executors=(
            Executors(execs, call_timeout=call_timeout, metrics=metrics)
            if settings.executor
            else None
        ),
        uses=uses,
        wake=wake,
        restore=uses.suspends.wake_for_use,
        paused_resume=settings.paused_streams == "Resume",
        tls_files=ReloadingTls(
            tls, settings.stream_tls_cert, settings.stream_tls_key, [settings.stream_client_ca]
        ),
        identity=identity,
    )


__all__ = ["StreamServer", "stream_server"]
