"""agent-sandbox's router protocol, spoken by sandlot's gateway: pure parts.

agent-sandbox's client, given ``api_url``, sends ``POST {api_url}/execute``,
``POST {api_url}/upload``, ``GET {api_url}/download/<path>``, ``/list/<path>`` and
``/exists/<path>``, naming the sandbox in ``X-Sandbox-ID`` and its namespace in
``X-Sandbox-Namespace``. sandlot serves that URL as part of its aggregated API
(``ROUTER_GROUP``): ``api_url`` is ``/apis/router.sandlot.dev/v1alpha1/namespaces/
<ns>/routers/agent-sandbox`` on the API server, so the API server authenticates the
user (their own credentials, or ``kubectl proxy``) and checks ``create`` (POST) or
``get`` (GET) on the subresource ``routers/<operation>`` (the operation is the
subresource, so a download's path never reaches RBAC), and the gateway authorises
each call per
sandbox with the very review of ``sandboxes/exec`` (execute) and ``sandboxes/files``
(the rest). No server runs in the sandbox: a command is an exec, a file operation
the agent's own files stream.

Relative paths resolve against one working directory per sandbox: the one its
commands run in (its image's WorkingDir, else ``/``), so a file written as
``a.txt`` is the ``a.txt`` a command then reads.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import unquote, urlsplit

from sandlot.api.reasons import ExecReason

ROUTER_GROUP = "router.sandlot.dev"
ROUTER_VERSION = "v1alpha1"
ROUTER_PREFIX = f"/apis/{ROUTER_GROUP}/{ROUTER_VERSION}"
ROUTER_RESOURCE = "routers"
ROUTER_NAME = "agent-sandbox"
"""The one router of a namespace: ``routers/agent-sandbox``."""

SANDBOX_HEADER = "X-Sandbox-ID"
NAMESPACE_HEADER = "X-Sandbox-Namespace"

EXECUTE, UPLOAD, DOWNLOAD, LIST, EXISTS = "execute", "upload", "download", "list", "exists"
POSTS = frozenset({EXECUTE, UPLOAD})
GETS = frozenset({DOWNLOAD, LIST, EXISTS})
TIMED_OUT_EXIT = 124
"""The exit code of a command ended at its ``timeout_seconds`` (coreutils' timeout's)."""
SHELL = "/bin/sh"
MAX_BODY = 64 << 20
"""Bytes of one request body (an upload, a command) the gateway takes at most."""


class RouterError(ValueError):
    """A call that cannot be served: its HTTP status and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RouterCall:
    namespace: str
    sandbox: str
    op: str
    path: str = ""
    """download, list, exists: the path as sent (decoded); "" for the working directory."""


def api_url(server: str, namespace: str) -> str:
    """The ``api_url`` agent-sandbox's client is given for ``namespace``."""
    base = f"{server.rstrip('/')}{ROUTER_PREFIX}/namespaces/{namespace}"
    return f"{base}/{ROUTER_RESOURCE}/{ROUTER_NAME}"


def parse_call(method: str, target: str, headers: Mapping[str, str]) -> RouterCall:
    """The call of a request the API server proxied, or a ``RouterError``."""
    url = urlsplit(target)
    raw = url.path
    if not raw.startswith(ROUTER_PREFIX + "/namespaces/"):
        raise RouterError(404, f"unknown path {raw!r}: not under {ROUTER_PREFIX}/namespaces/")
    # The path's segments after /namespaces/: NS, the resource, its name, and the
    # operation with whatever follows it.
    segments = raw[len(ROUTER_PREFIX + "/namespaces/") :].split("/", 3)
    namespace, resource, name, rest = (*segments, "", "", "")[:4]
    op, slash, tail = rest.partition("/")
    if resource != ROUTER_RESOURCE or name != ROUTER_NAME or op not in POSTS | GETS:
        raise RouterError(
            404,
            f"unknown path {raw!r}: expected .../namespaces/NS/{ROUTER_RESOURCE}/{ROUTER_NAME}/"
            + "|".join(sorted(POSTS | GETS)),
        )
    wanted = "POST" if op in POSTS else "GET"
    if method != wanted:
        raise RouterError(405, f"{op} takes {wanted}, not {method}")
    if op in POSTS and slash and tail:
        raise RouterError(404, f"{op} takes no path")
    lowered = {k.lower(): v for k, v in headers.items()}  # Go's proxy recases them
    sandbox = (lowered.get(SANDBOX_HEADER.lower()) or "").strip()
    if not sandbox:
        raise RouterError(400, f"{SANDBOX_HEADER} names no sandbox")
    asked_ns = (lowered.get(NAMESPACE_HEADER.lower()) or "").strip()
    ns = unquote(namespace)
    if asked_ns and asked_ns != ns:
        raise RouterError(400, f"{NAMESPACE_HEADER} {asked_ns!r} is not the URL's namespace {ns!r}")
    path = unquote(tail)
    if "\x00" in path or len(path) > 4096:
        raise RouterError(400, "a path of at most 4096 characters, no NUL")
    return RouterCall(ns, sandbox, op, path)


def resolve(path: str, workdir: str) -> str:
    """``path`` as an absolute path in the sandbox, relative ones under ``workdir``."""
    if path in ("", "."):
        return workdir
    return posixpath.normpath(posixpath.join(workdir, path))


def execute_argv(command: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The argv of an ``/execute`` command: the shell, with the claim's environment."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items() if _env_name(k)]
    return (SHELL, "-c", "\n".join([*lines, command]))


def _env_name(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_") and name.replace("_", "a").isalnum()


def parse_execute(body: bytes) -> tuple[str, float | None]:
    """``{"command": str, "timeout_seconds"?: number}`` of an ``/execute`` body."""
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        raise RouterError(400, "the body is not JSON") from None
    command = doc.get("command") if isinstance(doc, dict) else None
    if not isinstance(command, str) or not command:
        raise RouterError(400, 'the body needs "command": a non-empty string')
    timeout = doc.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise RouterError(400, '"timeout_seconds" is a positive number of seconds')
    return command, float(timeout) if timeout is not None else None


def execute_answer(stdout: bytes, stderr: bytes, exit_code: int, timed_out: bool) -> dict[str, Any]:
    return {
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
        "exit_code": exit_code,
        "timed_out": timed_out,
    }


def workdir_of(pwd: Mapping[str, Any], waited: float) -> str:
    """The sandbox's working directory from its ``pwd`` (an ``execute_answer``): the
    path it printed, else ``/`` (an image with no shell, a ``pwd`` that fails: the
    same next time). A ``pwd`` that did not end within ``waited`` seconds says
    nothing, and is refused rather than taken as ``/``: a later call asks again
    instead of writing elsewhere."""
    if pwd["timed_out"]:
        raise RouterError(504, f"the sandbox did not say its working directory within {waited:g}s")
    workdir = str(pwd["stdout"]).strip()
    return workdir if pwd["exit_code"] == 0 and workdir.startswith("/") else "/"


def parse_upload(content_type: str, body: bytes) -> tuple[str, bytes]:
    """The ``file`` field of a multipart/form-data upload: (its filename, its bytes)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise RouterError(400, "an upload is multipart/form-data")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message: Message = BytesParser(policy=HTTP).parsebytes(head + body)
    for part in message.iter_parts() if hasattr(message, "iter_parts") else []:
        if part.get_param("name", header="content-disposition") != "file":
            continue
        filename = part.get_filename()
        if not filename:
            raise RouterError(400, "the file field has no filename")
        payload = part.get_payload(decode=True)
        return str(filename), payload if isinstance(payload, bytes) else b""
    raise RouterError(400, "the upload has no file field")


def list_entries(docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The agent's listing as the router protocol's: files and directories only."""
    kinds = {"file": "file", "dir": "directory"}
    return [
        {
            "name": d["name"],
            "size": int(d.get("size") or 0),
            "type": kinds[d["type"]],
            "mod_time": float(d.get("mtime") or 0),
        }
        for d in docs
        if d.get("type") in kinds
    ]


def discovery(path: str) -> dict[str, Any] | None:
    """The discovery document the API server asks the router group for, if ``path``
    is one (the APIService is Available once ``ROUTER_PREFIX`` answers)."""
    group_version = f"{ROUTER_GROUP}/{ROUTER_VERSION}"
    version = {"groupVersion": group_version, "version": ROUTER_VERSION}
    group = {"name": ROUTER_GROUP, "versions": [version], "preferredVersion": version}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    if path == f"/apis/{ROUTER_GROUP}":
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    if path == ROUTER_PREFIX:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": f"{ROUTER_RESOURCE}/{op}",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Router",
                    "verbs": ["create"] if op in POSTS else ["get"],
                }
                for op in sorted(POSTS | GETS)
            ],
        }
    return None


@dataclass(frozen=True)
class Ended:
    """How a stream ended: ``exit_code`` (0 for a file operation done), or the HTTP
    ``code`` and ``message`` of a failure (404: no such file)."""

    exit_code: int | None
    code: int = 200
    message: str = ""


def ended(status: bytes | None) -> Ended:
    """The agent's closing status (a ``metav1.Status``) of an exec or files stream."""
    if status is None:
        return Ended(None, 502, "the stream ended before its status came")
    try:
        body = json.loads(status)
    except ValueError:
        return Ended(None, 502, f"unreadable status: {status[:200]!r}")
    if body.get("status") == "Success":
        return Ended(0)
    if body.get("reason") == ExecReason.NON_ZERO_EXIT_CODE:
        for cause in (body.get("details") or {}).get("causes") or []:
            if cause.get("reason") == ExecReason.EXIT_CODE and str(cause.get("message")).isdigit():
                return Ended(int(cause["message"]))
    return Ended(None, int(body.get("code") or 500), str(body.get("message") or "failed"))
