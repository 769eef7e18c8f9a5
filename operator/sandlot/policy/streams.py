"""``sandlot logs`` and ``sandlot exec``: what a stream request asks, who may ask it,
and how its bytes are framed. Pure.

A stream reaches the agent through the API server's proxy, which authenticates
the caller and then removes the ``Authorization`` header; the agent sees only
the proxy's connection. So the CLI carries the user's bearer token a second time
in ``STREAM_TOKEN_HEADER``, the agent asks the API server who it is
(TokenReview) and whether that identity may do this (SubjectAccessReview with
the reviewed user, groups, extra and uid), and refuses unless both say yes.

Verbs, on ``sandboxes.sandlot.dev`` (so ``kubectl auth can-i`` answers them):

- exec: verb ``exec`` on ``sandboxes`` (``kubectl auth can-i exec sandboxes``);
- logs: verb ``get`` on ``sandboxes/log`` (``kubectl auth can-i get sandboxes
  --subresource=log``), as ``kubectl logs`` asks ``get pods/log``.

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
from urllib.parse import parse_qs, urlencode, urlsplit

from sandlot.api.common import GROUP

SUBPROTOCOL = "v5.channel.k8s.io"
STREAM_TOKEN_HEADER = "X-Sandlot-Authorization"
# The request's options (a URL query) travel in a header: the API server's proxy
# forwards an upgrade request to the pod without the URL's query.
STREAM_OPTIONS_HEADER = "X-Sandlot-Stream-Options"

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255

LOG, EXEC = "log", "exec"


class StreamRequestError(ValueError):
    """A request path or query the agent cannot serve; its text is for the user."""


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


def parse_stream_request(target: str, options: str = "") -> StreamRequest:
    """The request of path ``/sandboxes/<ns>/<name>/log`` or ``.../exec`` with
    ``options`` (the ``STREAM_OPTIONS_HEADER``, a URL query: ``follow=true&tail=10``
    or ``command=sh&command=-c&tty=true&stdin=true``). A query on the path itself is
    ignored: the API server's proxy drops it from upgrade requests."""
    url = urlsplit(target)
    parts = [p for p in url.path.split("/") if p]
    if len(parts) != 4 or parts[0] != "sandboxes" or parts[3] not in (LOG, EXEC):
        raise StreamRequestError(
            f"unknown path {url.path!r}: expected /sandboxes/NAMESPACE/NAME/log or .../exec"
        )
    query = parse_qs(options)
    flags = {k: (v[-1].lower() in ("1", "true", "yes")) for k, v in query.items()}
    _, namespace, name, kind = parts
    if kind == LOG:
        tail = None
        if "tail" in query:
            try:
                tail = int(query["tail"][-1])
            except ValueError:
                raise StreamRequestError("tail must be a whole number of lines") from None
            if tail < 0:
                raise StreamRequestError("tail must not be negative")
        return StreamRequest(LOG, namespace, name, follow=flags.get("follow", False), tail=tail)
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


def stream_path(request: StreamRequest) -> tuple[str, str]:
    """The agent's path and options header for ``request``: ``parse_stream_request``'s inverse."""
    base = f"/sandboxes/{request.namespace}/{request.name}/{request.kind}"
    query: list[tuple[str, str]] = []
    if request.kind == LOG:
        if request.follow:
            query.append(("follow", "true"))
        if request.tail is not None:
            query.append(("tail", str(request.tail)))
    else:
        query.extend(("command", arg) for arg in request.command)
        if request.tty:
            query.append(("tty", "true"))
        if request.stdin:
            query.append(("stdin", "true"))
    return base, urlencode(query)


def proxy_path(namespace: str, pod: str, port: int) -> str:
    """The API server path proxying to ``port`` of ``pod``: its pods/proxy subresource."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy"


# -- authorization -------------------------------------------------------------------


def resource_attributes(request: StreamRequest) -> dict[str, str]:
    """The SubjectAccessReview's ``resourceAttributes`` for ``request``."""
    attributes = {
        "namespace": request.namespace,
        "group": GROUP,
        "resource": "sandboxes",
        "name": request.name,
    }
    if request.kind == EXEC:
        attributes["verb"] = "exec"
    else:
        attributes["verb"] = "get"
        attributes["subresource"] = "log"
    return attributes


def bearer_token(header: str | None) -> str | None:
    """The token of a ``Bearer <token>`` header value; None when absent or another scheme."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def access_review_spec(user_info: Mapping[str, Any], request: StreamRequest) -> dict[str, Any]:
    """The SubjectAccessReview spec asking for the reviewed user exactly as the API
    server knows it: user, groups, extra and uid."""
    spec: dict[str, Any] = {
        "user": str(user_info.get("username") or ""),
        "groups": list(user_info.get("groups") or []),
        "resourceAttributes": resource_attributes(request),
    }
    if user_info.get("extra"):
        spec["extra"] = {k: list(v) for k, v in dict(user_info["extra"]).items()}
    if user_info.get("uid"):
        spec["uid"] = str(user_info["uid"])
    return spec


@dataclass(frozen=True)
class Access:
    allowed: bool
    code: int  # the HTTP status to answer with when not allowed
    message: str
    user: str = ""


def what_is_asked(request: StreamRequest) -> str:
    if request.kind == EXEC:
        return f'exec in sandboxes "{request.name}" in namespace "{request.namespace}"'
    return f'get sandboxes/log "{request.name}" in namespace "{request.namespace}"'


def decide_access(
    token: str | None,
    token_review: Mapping[str, Any] | None,
    access_review: Mapping[str, Any] | None,
    request: StreamRequest,
) -> Access:
    """From the TokenReview's and SubjectAccessReview's ``status`` (None: not asked
    yet), whether the caller may; ``allowed`` only when both said yes."""
    if not token:
        return Access(
            False,
            401,
            f"no bearer token in the {STREAM_TOKEN_HEADER} header: the caller's identity "
            "is unknown (sandlot logs/exec send it; client-certificate users need a token)",
        )
    if token_review is None:
        return Access(False, 401, "the token was not reviewed")
    if not token_review.get("authenticated"):
        reason = token_review.get("error") or "the API server did not authenticate it"
        return Access(False, 401, f"the bearer token is not valid: {reason}")
    user = str((token_review.get("user") or {}).get("username") or "")
    if access_review is None:
        return Access(False, 403, "access was not reviewed", user)
    asked = what_is_asked(request)
    if access_review.get("denied") or not access_review.get("allowed"):
        why = access_review.get("reason") or access_review.get("evaluationError") or ""
        return Access(
            False,
            403,
            f'user "{user}" cannot {asked}' + (f": {why}" if why else ""),
            user,
        )
    return Access(True, 200, f'user "{user}" may {asked}', user)


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
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


def error_status(message: str) -> bytes:
    """The status message for a stream that failed before or without an exit code."""
    return json.dumps(
        {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"}
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
    if body.get("reason") == "NonZeroExitCode":
        causes: Sequence[Mapping[str, Any]] = (body.get("details") or {}).get("causes") or []
        for cause in causes:
            if cause.get("reason") == "ExitCode":
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
    "CLOSE",
    "EXEC",
    "LOG",
    "RESIZE",
    "STATUS",
    "STDERR",
    "STDIN",
    "STDOUT",
    "STREAM_OPTIONS_HEADER",
    "STREAM_TOKEN_HEADER",
    "SUBPROTOCOL",
    "Access",
    "StreamEnd",
    "StreamRequest",
    "StreamRequestError",
    "access_review_spec",
    "bearer_token",
    "close_stdin_frame",
    "decide_access",
    "decode_frame",
    "encode_frame",
    "end_of",
    "error_status",
    "exit_status",
    "parse_resize",
    "parse_stream_request",
    "proxy_path",
    "resize_frame",
    "resource_attributes",
    "stream_path",
    "tail_offset",
]
