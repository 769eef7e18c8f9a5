"""agent-sandbox's router protocol, served by the gateway (``policy.router``).

A listener of its own beside the streams' (the router's ``POST``s are plain HTTP,
the streams' WebSockets), behind the API server as the aggregated API
``router.sandlot.dev``, with the same front-proxy TLS. Each call goes the streams'
way and nowhere else: the caller named by the front proxy, the review of
``sandboxes/exec`` (``/execute``) or ``sandboxes/files`` (the rest) for the sandbox
named in ``X-Sandbox-ID``, a session of the caller's caps, and the agent of the
sandbox's node over mutual TLS (``Gateway.authorize``, ``Gateway.open_agent``),
where a command is an exec and a file operation the agent's files stream. So
nobody reaches a sandbox through the router they could not exec into.
"""

from __future__ import annotations

import json
import logging
import posixpath
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from sandlot.adapters.mtls import peer_common_name
from sandlot.adapters.startup import cannot_listen, setting_name
from sandlot.adapters.streamlisten import TlsListener
from sandlot.gateway.server import Gateway, Refusal
from sandlot.policy.router import (
    DOWNLOAD,
    EXECUTE,
    EXISTS,
    LIST,
    MAX_BODY,
    SHELL,
    TIMED_OUT_EXIT,
    UPLOAD,
    RouterCall,
    RouterError,
    discovery,
    ended,
    execute_answer,
    execute_argv,
    list_entries,
    parse_call,
    parse_execute,
    parse_upload,
    resolve,
    workdir_of,
)
from sandlot.policy.streamaccess import Caller, caller_of
from sandlot.policy.streams import (
    EXEC,
    FILES,
    MKDIR,
    READ,
    STAT,
    STATUS,
    STDERR,
    STDIN,
    STDOUT,
    WRITE,
    StreamRequest,
    close_stdin_frame,
    decode_frame,
    encode_frame,
)
from sandlot.policy.streams import LIST as LIST_OP

log = logging.getLogger(__name__)

CHUNK = 256 << 10
WORKDIR_TTL = 300.0  # seconds a sandbox's working directory is remembered


class RouterServer(TlsListener[ThreadingHTTPServer]):
    """``start()`` listens; ``shutdown()`` ends it. ``claim_env(namespace, sandbox)``
    is the environment its claim gives every command (``{}`` when none)."""

    listening_as = "the router"

    def __init__(
        self,
        gateway: Gateway,
        *,
        bind: str,
        port: int,
        server_tls: ssl.SSLContext,
        claim_env: Callable[[str, str], Mapping[str, str]],
        call_timeout: float,
    ) -> None:
        super().__init__(bind=bind, port=port, server_tls=server_tls)
        self.gateway = gateway
        self.claim_env = claim_env
        self.call_timeout = call_timeout
        self._workdirs: dict[tuple[str, str], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        router = self

        class Handler(RouterHandler):
            pass

        Handler.router = router
        try:
            server = ThreadingHTTPServer((self.bind or "", self.requested_port), Handler)
        except OSError as e:
            where = f"{self.bind or '*'}:{self.requested_port}"
            raise cannot_listen(setting_name("router_port"), where, e) from None
        server.daemon_threads = True
        server.socket = self._server_tls.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._server = server
        threading.Thread(target=server.serve_forever, name="router", daemon=True).start()
        log.info("agent-sandbox router listening on %s:%d", self.bind or "*", self.port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- one call ---------------------------------------------------------------------

    def serve(self, call: RouterCall, caller: Caller | None, body: bytes, ctype: str) -> Any:
        """The answer to ``call``: a JSON document, bytes, or a ``RouterError``."""
        if call.op == EXECUTE:
            command, timeout = parse_execute(body)
            env = self.claim_env(call.namespace, call.sandbox)
            return self._execute(call, caller, execute_argv(command, env), timeout)
        if call.op == UPLOAD:
            filename, data = parse_upload(ctype, body)
            self._upload(call, caller, filename, data)
            return {"message": f"{filename} uploaded"}
        path = resolve(call.path, self._workdir(call, caller))
        if call.op == DOWNLOAD:
            return self._files(call, caller, READ, path)
        if call.op == LIST:
            return list_entries(json.loads(self._files(call, caller, LIST_OP, path)))
        assert call.op == EXISTS
        try:
            self._files(call, caller, STAT, path)
        except RouterError as e:
            if e.status != 404:
                raise
            return {"path": call.path, "exists": False}
        return {"path": call.path, "exists": True}

    def _open(self, asked: StreamRequest, caller: Caller | None) -> ClientConnection:
        """The agent's side of ``asked``, a session of the caller's caps taken (given
        back by ``_stream``)."""
        try:
            self.gateway.authorize(caller, asked)
            user, groups = (caller.user, caller.groups) if caller else ("", ())
            self.gateway.sessions.take(user, groups)
            try:
                return self.gateway.open_agent(asked, user)
            except BaseException:
                self.gateway.sessions.give_back(user, groups)
                raise
        except Refusal as e:
            log.info(
                "router refused (%d): %s%s", e.status, e.message, e.detail and f" ({e.detail})"
            )
            raise RouterError(e.status, e.message) from None

    def _stream(
        self,
        asked: StreamRequest,
        caller: Caller | None,
        data: bytes | None = None,
        timeout: float | None = None,
    ) -> tuple[dict[int, bytes], bytes | None, bool]:
        """Open, send ``data`` on stdin (then close it), collect until the status:
        (output by channel, the status, whether ``timeout`` ended it first)."""
        agent = self._open(asked, caller)
        out: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
        status: bytes | None = None
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        timed_out = False
        try:
            if data is not None:
                for start in range(0, len(data), CHUNK):
                    agent.send(encode_frame(STDIN, data[start : start + CHUNK]))
                agent.send(close_stdin_frame())
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True  # closing the stream ends the command
                    break
                try:
                    message = agent.recv(timeout=left)
                except TimeoutError:
                    continue
                if isinstance(message, str):
                    continue
                channel, chunk = decode_frame(message)
                if channel == STATUS:
                    status = chunk
                    break
                if channel in out:
                    out[channel].append(chunk)
        except ConnectionClosed:
            pass
        finally:
            agent.close()
            user, groups = (caller.user, caller.groups) if caller else ("", ())
            self.gateway.sessions.give_back(user, groups)
        return {k: b"".join(v) for k, v in out.items()}, status, timed_out

    def _execute(
        self,
        call: RouterCall,
        caller: Caller | None,
        argv: tuple[str, ...],
        timeout: float | None,
    ) -> dict[str, Any]:
        asked = StreamRequest(EXEC, call.namespace, call.sandbox, command=argv)
        out, status, timed_out = self._stream(asked, caller, timeout=timeout)
        if timed_out:
            return execute_answer(out[STDOUT], out[STDERR], TIMED_OUT_EXIT, True)
        end = ended(status)
        if end.exit_code is None:
            raise RouterError(end.code, end.message)
        return execute_answer(out[STDOUT], out[STDERR], end.exit_code, False)

    def _files(self, call: RouterCall, caller: Caller | None, op: str, path: str) -> bytes:
        return self._file_op(call, caller, op, path, None)

    def _file_op(
        self, call: RouterCall, caller: Caller | None, op: str, path: str, data: bytes | None
    ) -> bytes:
        asked = StreamRequest(FILES, call.namespace, call.sandbox, op=op, path=path)
        out, status, _ = self._stream(asked, caller, data, timeout=self.call_timeout * 10)
        end = ended(status)
        if end.exit_code is None:
            raise RouterError(end.code, end.message)
        return out[STDOUT]

    def _upload(self, call: RouterCall, caller: Caller | None, name: str, data: bytes) -> None:
        workdir = self._workdir(call, caller)
        path = resolve(name, workdir)
        parents: list[str] = []
        parent = posixpath.dirname(path)
        while parent not in ("/", "") and parent != workdir:
            parents.append(parent)
            parent = posixpath.dirname(parent)
        for directory in reversed(parents):  # parents created, as the router's runtime does
            self._file_op(call, caller, MKDIR, directory, None)
        self._file_op(call, caller, WRITE, path, data)

    def _workdir(self, call: RouterCall, caller: Caller | None) -> str:
        """Where the sandbox's commands run (its image's WorkingDir, else ``/``), asked
        of the sandbox once (``pwd``) and remembered a while."""
        key = (call.namespace, call.sandbox)
        now = time.monotonic()
        with self._lock:
            known = self._workdirs.get(key)
        if known is not None and now - known[0] < WORKDIR_TTL:
            return known[1]
        answer = self._execute(call, caller, (SHELL, "-c", "pwd"), self.call_timeout)
        workdir = workdir_of(answer, self.call_timeout)
        with self._lock:
            self._workdirs[key] = (now, workdir)
        return workdir


class RouterHandler(BaseHTTPRequestHandler):
    router: RouterServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        try:
            self.connection.do_handshake()  # type: ignore[attr-defined]
        except (OSError, ssl.SSLError):
            self.close_connection = True
            raise

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("router: " + format, *args)

    def _serve(self, method: str) -> None:
        gateway = self.router.gateway
        proxy_name = peer_common_name(self.connection)
        caller = caller_of(list(self.headers.items()), gateway.requestheader(), proxy_name)
        from_proxy = caller is not None or gateway.from_front_proxy_name(proxy_name)
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise RouterError(413, f"a body of at most {MAX_BODY} bytes")
            body = self.rfile.read(length) if length else b""
            doc = discovery(self.path.split("?", 1)[0].rstrip("/"))
            if doc is not None:
                if not from_proxy:
                    raise RouterError(401, "only the API server's front proxy may ask")
                self._answer(200, doc)
                return
            call = parse_call(method, self.path, dict(self.headers.items()))
            if not from_proxy:
                raise RouterError(401, "only the API server's front proxy may ask")
            answer = self.router.serve(call, caller, body, self.headers.get("Content-Type", ""))
        except RouterError as e:
            self._answer(e.status, {"error": e.message})
            return
        except Exception as e:  # one call's failure is its answer, never the server's end
            log.exception("router call failed")
            self._answer(500, {"error": f"the gateway failed the call: {e}"})
            return
        self._answer(200, answer)

    def _answer(self, status: int, answer: Any) -> None:
        if isinstance(answer, bytes):
            body, ctype = answer, "application/octet-stream"
        else:
            body, ctype = json.dumps(answer).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


__all__ = ["RouterServer"]
