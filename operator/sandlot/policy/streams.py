"""``sandlot logs`` and ``sandlot exec``: what a stream request asks and how its
bytes are framed (who may ask: ``policy.streamaccess``). Pure.

Streams are subresources of an aggregated API (``SUBRESOURCE_GROUP``), as the
kubelet's ``pods/exec`` and ``pods/log`` are of the core one: the user's request
goes to the API server, which authenticates it and hands it, with the user's name
and groups in front-proxy headers and never the user's credential, to sandlot's
stream gateway. The gateway authorizes that user (a SubjectAccessReview made under
its own identity), resolves the sandbox's node itself and reaches that node's agent
over mutual TLS. No node ever sees a user's token.

Verbs, on ``sandboxes`` in ``SUBRESOURCE_GROUP`` (``kubectl auth can-i`` answers them):

- logs: ``get`` on ``sandboxes/log``, as ``kubectl logs`` asks ``get pods/log``;
- exec: ``create`` on ``sandboxes/exec``, as ``kubectl exec`` asks ``create
  pods/exec``; port-forward likewise on ``sandboxes/portforward``;
- files: ``get`` on ``sandboxes/files`` to read, list and stat, ``create`` to
  write and to make a directory, ``delete`` to remove.

Every stream is a WebSocket, so the API server itself first checks ``get`` (the
verb of its GET) before it proxies; the chart's roles grant what both ask.

The exec command travels in the request's query, so the API server's audit log
records it. Between the gateway and the agent, a request is a path and its
options (``agent_request``).

Frames follow Kubernetes' ``v5.channel.k8s.io``: every binary WebSocket message
starts with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize,
255 close: ``[255, 0]`` closes stdin). The status message is a
``metav1.Status``; a non-zero exit says its code in a cause, as the kubelet's does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from sandlot.api.reasons import ExecReason

SUBRESOURCE_GROUP = "subresources.sandlot.dev"
SUBRESOURCE_VERSION = "v1alpha1"
API_PREFIX = f"/apis/{SUBRESOURCE_GROUP}/{SUBRESOURCE_VERSION}"
SUBPROTOCOL = "v5.channel.k8s.io"
# Gateway to agent: the request's options (a URL query), the user it serves (a
# name for the agent's log, never a credential), and the seconds the gateway waits
# for the upgrade (the agent answers within them: ``policy.streamslots``).
STREAM_OPTIONS_HEADER = "X-Sandlot-Stream-Options"
CALLER_HEADER = "X-Sandlot-Caller"
OPEN_TIMEOUT_HEADER = "X-Sandlot-Open-Timeout"
# One stream's id, the same on the gateway's second try of an upgrade the agent never
# answered: an agent that did take the first never runs the stream twice.
STREAM_ID_HEADER = "X-Sandlot-Stream-Id"

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255

LOG, EXEC, FILES, PORTFORWARD = "log", "exec", "files", "portforward"
KINDS = (LOG, EXEC, FILES, PORTFORWARD)
# Files: what each operation does to the sandbox's filesystem.
READ, WRITE, LIST, STAT, REMOVE = "read", "write", "list", "stat", "remove"
MKDIR = "mkdir"
FILE_OPS = {
    READ: "get",
    LIST: "get",
    STAT: "get",
    WRITE: "create",
    MKDIR: "create",
    REMOVE: "delete",
}
MAX_PATH = 4096


class StreamRequestError(ValueError):
    """A request path or query that cannot be served; its text is for the user."""


@dataclass(frozen=True)
class StreamRequest:
    kind: str  # LOG or EXEC
    namespace: str
    name: str
    follow: bool = False
    tail: int | None = None  # lines; None: all
    command: tuple[str, ...] = ()
    tty: bool = False
    stdin: bool = False
    op: str = ""  # files: one of FILE_OPS
    path: str = ""  # files: a path inside the sandbox
    port: int = 0  # portforward: a port in the sandbox's network namespace

    @property
    def verb(self) -> str:
        """The verb the gateway asks for: ``get`` for logs and reading files, ``create``
        for exec, port-forward, writing and making directories, ``delete`` for removing
        (see the module docstring)."""
        if self.kind == LOG:
            return "get"
        if self.kind == FILES:
            return FILE_OPS[self.op]
        return "create"


def _files(namespace: str, name: str, query: Mapping[str, list[str]]) -> StreamRequest:
    op = (query.get("op") or [""])[-1]
    if op not in FILE_OPS:
        raise StreamRequestError(f"files needs op= one of {', '.join(FILE_OPS)} (got {op!r})")
    path = (query.get("path") or [""])[-1]
    if not path or len(path) > MAX_PATH or "\x00" in path:
        raise StreamRequestError(f"files needs a path= of 1 to {MAX_PATH} characters, no NUL")
    return StreamRequest(FILES, namespace, name, op=op, path=path)


def _portforward(namespace: str, name: str, query: Mapping[str, list[str]]) -> StreamRequest:
    raw = (query.get("port") or [""])[-1]
    if not raw.isdigit() or not 0 < int(raw) <= 65535:
        raise StreamRequestError(f"portforward needs port= from 1 to 65535 (got {raw!r})")
    return StreamRequest(PORTFORWARD, namespace, name, port=int(raw))


def _options(kind: str, namespace: str, name: str, query: Mapping[str, list[str]]) -> StreamRequest:
    flags = {k: (v[-1].lower() in ("1", "true", "yes")) for k, v in query.items()}
    if kind == LOG:
        tail = None
        raw = query.get("tailLines") or query.get("tail")
        if raw:
            try:
                tail = int(raw[-1])
            except ValueError:
                raise StreamRequestError("tail must be a whole number of lines") from None
            if tail < 0:
                raise StreamRequestError("tail must not be negative")
        return StreamRequest(LOG, namespace, name, follow=flags.get("follow", False), tail=tail)
    if kind == FILES:
        return _files(namespace, name, query)
    if kind == PORTFORWARD:
        return _portforward(namespace, name, query)
    command = tuple(query.get("command", ()))
    if not command:
        raise StreamRequestError("exec needs a command (command=...)")
    return StreamRequest(
        EXEC,
        namespace,
        name,
        command=command,
        tty=flags.get("tty", False),
        stdin=flags.get("stdin", False),
    )


def _query(request: StreamRequest, tail_key: str) -> str:
    query: list[tuple[str, str]] = []
    if request.kind == LOG:
        if request.follow:
            query.append(("follow", "true"))
        if request.tail is not None:
            query.append((tail_key, str(request.tail)))
    elif request.kind == FILES:
        query.extend((("op", request.op), ("path", request.path)))
    elif request.kind == PORTFORWARD:
        query.append(("port", str(request.port)))
    else:
        query.extend(("command", arg) for arg in request.command)
        if request.tty:
            query.append(("tty", "true"))
        if request.stdin:
            query.append(("stdin", "true"))
    return urlencode(query)


# -- user to API server to gateway ----------------------------------------------------


def api_path(request: StreamRequest) -> str:
    """The API server path (with its query) of ``request``: what the CLI asks for."""
    ns, name = quote(request.namespace, safe=""), quote(request.name, safe="")
    base = f"{API_PREFIX}/namespaces/{ns}/sandboxes/{name}/{request.kind}"
    query = _query(request, "tailLines")
    return f"{base}?{query}" if query else base


def parse_api_request(target: str) -> StreamRequest:
    """The request of an API path ``api_path`` made; ``StreamRequestError`` naming
    what is wrong otherwise."""
    url = urlsplit(target)
    if not url.path.startswith(API_PREFIX + "/"):
        raise StreamRequestError(f"unknown path {url.path!r}: not under {API_PREFIX}")
    parts = [unquote(p) for p in url.path[len(API_PREFIX) :].split("/") if p]
    if len(parts) != 5 or parts[0] != "namespaces" or parts[2] != "sandboxes":
        raise StreamRequestError(
            f"unknown path {url.path!r}: expected {API_PREFIX}/namespaces/NAMESPACE/"
            "sandboxes/NAME/" + "|".join(KINDS)
        )
    _, namespace, _, name, kind = parts
    if kind not in KINDS:
        raise StreamRequestError(f"unknown subresource {kind!r}: sandboxes have {', '.join(KINDS)}")
    return _options(kind, namespace, name, parse_qs(url.query))


# -- gateway to agent ------------------------------------------------------------------


def agent_request(request: StreamRequest) -> tuple[str, str]:
    """The agent's path and options header for ``request``: ``parse_agent_request``'s inverse."""
    base = f"/sandboxes/{request.namespace}/{request.name}/{request.kind}"
    return base, _query(request, "tail")


def parse_agent_request(target: str, options: str = "") -> StreamRequest:
    """The request of path ``/sandboxes/<ns>/<name>/log`` or ``.../exec`` with
    ``options`` (the ``STREAM_OPTIONS_HEADER``, a URL query)."""
    url = urlsplit(target)
    parts = [p for p in url.path.split("/") if p]
    if len(parts) != 4 or parts[0] != "sandboxes" or parts[3] not in KINDS:
        raise StreamRequestError(
            f"unknown path {url.path!r}: expected /sandboxes/NAMESPACE/NAME/KIND, KIND one of "
            + ", ".join(KINDS)
        )
    _, namespace, name, kind = parts
    return _options(kind, namespace, name, parse_qs(options))


# -- frames --------------------------------------------------------------------------


def encode_frame(channel: int, data: bytes) -> bytes:
    if not 0 <= channel <= 255:
        raise ValueError(f"channel {channel} is not a byte")
    return bytes([channel]) + data


def decode_frame(message: bytes) -> tuple[int, bytes]:
    if not message:
        raise ValueError("an empty message carries no channel byte")
    return message[0], message[1:]


def close_stdin_frame() -> bytes:
    return encode_frame(CLOSE, bytes([STDIN]))


def resize_frame(width: int, height: int) -> bytes:
    return encode_frame(RESIZE, json.dumps({"Width": width, "Height": height}).encode())


def parse_resize(data: bytes) -> tuple[int, int]:
    """(width, height) of a resize message; ValueError when it is not one."""
    try:
        body = json.loads(data)
        width, height = int(body["Width"]), int(body["Height"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a resize message: {data[:64]!r}") from exc
    if not (0 < width <= 0xFFFF and 0 < height <= 0xFFFF):
        raise ValueError(f"terminal size {width}x{height} out of range")
    return width, height


def exit_status(code: int) -> bytes:
    """The status message for a command that exited with ``code``."""
    if code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode()
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: {code}",
            "reason": ExecReason.NON_ZERO_EXIT_CODE,
            "details": {"causes": [{"reason": ExecReason.EXIT_CODE, "message": str(code)}]},
        }
    ).encode()


def error_status(message: str, code: int = 500) -> bytes:
    """The status message for a stream that failed before or without an exit code;
    ``code`` is the HTTP status it stands for (404: no such file, 413: over a cap)."""
    reason = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict"}.get(
        code, "RequestEntityTooLarge" if code == 413 else "InternalError"
    )
    return json.dumps(
        {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
    ).encode()


@dataclass(frozen=True)
class StreamEnd:
    exit_code: int
    message: str = ""


def end_of(status: bytes | None) -> StreamEnd:
    """What a status message means for the CLI: the command's exit code, or 1 with
    the message when the stream failed; no status at all means the connection was
    cut before the end."""
    if status is None:
        return StreamEnd(1, "the connection ended before the command's exit status came")
    try:
        body = json.loads(status)
    except ValueError:
        return StreamEnd(1, f"unreadable status: {status[:200]!r}")
    if body.get("status") == "Success":
        return StreamEnd(0)
    if body.get("reason") == ExecReason.NON_ZERO_EXIT_CODE:
        causes: Sequence[Mapping[str, Any]] = (body.get("details") or {}).get("causes") or []
        for cause in causes:
            if cause.get("reason") == ExecReason.EXIT_CODE:
                try:
                    return StreamEnd(int(cause.get("message", "")))
                except ValueError:
                    break
    return StreamEnd(1, str(body.get("message") or "the stream failed"))


def tail_offset(data: bytes, size: int, lines: int) -> int:
    """The offset in a file of ``size`` bytes, whose last ``len(data)`` bytes are
    ``data``, where its last ``lines`` lines begin (a partial last line counts as
    one). When ``data`` holds fewer lines than asked and is not the whole file, the
    caller reads a larger window; this answers the window's start then."""
    if lines == 0:
        return size
    start = size - len(data)
    end = len(data)
    if end and data.endswith(b"\n"):
        end -= 1  # the final newline closes the last line: it does not start one
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, end)
        if cut < 0:
            return start
        end = cut
    return start + end + 1


__all__ = [
    "API_PREFIX",
    "CALLER_HEADER",
    "CLOSE",
    "EXEC",
    "FILES",
    "FILE_OPS",
    "KINDS",
    "LIST",
    "LOG",
    "MAX_PATH",
    "MKDIR",
    "OPEN_TIMEOUT_HEADER",
    "PORTFORWARD",
    "READ",
    "REMOVE",
    "RESIZE",
    "STAT",
    "STATUS",
    "STDERR",
    "STDIN",
    "STDOUT",
    "STREAM_ID_HEADER",
    "STREAM_OPTIONS_HEADER",
    "SUBPROTOCOL",
    "SUBRESOURCE_GROUP",
    "SUBRESOURCE_VERSION",
    "WRITE",
    "StreamEnd",
    "StreamRequest",
    "StreamRequestError",
    "agent_request",
    "api_path",
    "close_stdin_frame",
    "decode_frame",
    "encode_frame",
    "end_of",
    "error_status",
    "exit_status",
    "parse_agent_request",
    "parse_api_request",
    "parse_resize",
    "resize_frame",
    "tail_offset",
]
