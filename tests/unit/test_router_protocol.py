"""agent-sandbox's router protocol as sandlot's gateway reads it (``policy.router``):
paths, headers, bodies and answers as plain data."""

from __future__ import annotations

import json

import pytest

from sandlot.policy.router import (
    RouterError,
    api_url,
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
from sandlot.policy.streams import error_status, exit_status

BASE = "/apis/router.sandlot.dev/v1alpha1/namespaces/team/routers/agent-sandbox"
HEADERS = {"X-Sandbox-ID": "sb-1", "X-Sandbox-Namespace": "team"}


def test_api_url_is_the_namespaces_router_on_the_server() -> None:
    assert api_url("https://k8s:6443/", "team") == "https://k8s:6443" + BASE


@pytest.mark.parametrize(
    ("method", "target", "op", "path"),
    [
        ("POST", f"{BASE}/execute", "execute", ""),
        ("POST", f"{BASE}/upload", "upload", ""),
        ("GET", f"{BASE}/download/dir%2Fa%20b.txt", "download", "dir/a b.txt"),
        ("GET", f"{BASE}/download/dir/a.txt", "download", "dir/a.txt"),
        ("GET", f"{BASE}/list/", "list", ""),
        ("GET", f"{BASE}/list/.", "list", "."),
        ("GET", f"{BASE}/exists/%2Fetc%2Fhostname", "exists", "/etc/hostname"),
    ],
    ids=[
        "execute",
        "upload",
        "download-encoded",
        "download-plain",
        "list-root",
        "list-dot",
        "exists",
    ],
)
def test_calls_are_read_from_the_path_and_headers(
    method: str, target: str, op: str, path: str
) -> None:
    call = parse_call(method, target, HEADERS)
    assert (call.namespace, call.sandbox, call.op, call.path) == ("team", "sb-1", op, path)


def test_header_names_are_read_whatever_their_case() -> None:
    call = parse_call("POST", f"{BASE}/execute", {"x-sandbox-id": "sb-2"})
    assert call.sandbox == "sb-2"


@pytest.mark.parametrize(
    ("method", "target", "headers", "status"),
    [
        ("GET", f"{BASE}/execute", HEADERS, 405),
        ("POST", f"{BASE}/download/a", HEADERS, 405),
        ("POST", f"{BASE}/execute", {}, 400),
        ("POST", f"{BASE}/execute", {**HEADERS, "X-Sandbox-Namespace": "other"}, 400),
        ("GET", f"{BASE}/shell/a", HEADERS, 404),
        ("GET", "/apis/router.sandlot.dev/v1alpha1/namespaces/team/routers/x/list/", HEADERS, 404),
        ("GET", f"{BASE}/download/a%00b", HEADERS, 400),
    ],
    ids=[
        "get-execute",
        "post-download",
        "no-sandbox",
        "other-namespace",
        "unknown-op",
        "other-router",
        "nul",
    ],
)
def test_what_cannot_be_served_is_refused_with_its_status(
    method: str, target: str, headers: dict[str, str], status: int
) -> None:
    with pytest.raises(RouterError) as caught:
        parse_call(method, target, headers)
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("path", "resolved"),
    [
        ("", "/app"),
        (".", "/app"),
        ("a/b.txt", "/app/a/b.txt"),
        ("/etc/x", "/etc/x"),
        ("../x", "/x"),
    ],
)
def test_relative_paths_resolve_against_the_working_directory(path: str, resolved: str) -> None:
    assert resolve(path, "/app") == resolved


def test_a_command_runs_through_the_shell_with_the_claims_environment() -> None:
    argv = execute_argv("echo $A", {"A": "it's", "bad name": "x"})
    assert argv == ("/bin/sh", "-c", "export A='it'\"'\"'s'\necho $A")


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        (b'{"command": "ls"}', ("ls", None)),
        (b'{"command": "ls", "timeout_seconds": 2.5}', ("ls", 2.5)),
    ],
)
def test_execute_bodies(body: bytes, wanted: tuple[str, float | None]) -> None:
    assert parse_execute(body) == wanted


@pytest.mark.parametrize(
    "body", [b"nope", b"{}", b'{"command": ""}', b'{"command": "ls", "timeout_seconds": -1}']
)
def test_bad_execute_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(RouterError) as caught:
        parse_execute(body)
    assert caught.value.status == 400


def test_an_upload_is_the_file_field_of_a_multipart_form() -> None:
    boundary = "xyz"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="other"\r\n\r\nignored\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d/a.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + b"\x00\x01\r\nraw"
        + f"\r\n--{boundary}--\r\n".encode()
    )
    assert parse_upload(f"multipart/form-data; boundary={boundary}", body) == (
        "d/a.bin",
        b"\x00\x01\r\nraw",
    )
    with pytest.raises(RouterError):
        parse_upload("application/json", b"{}")


def test_a_listing_keeps_files_and_directories_in_the_routers_shape() -> None:
    docs = [
        {"name": "a", "type": "file", "size": 3, "mode": 420, "mtime": 7},
        {"name": "d", "type": "dir", "size": 4096, "mode": 493, "mtime": 8},
        {"name": "l", "type": "symlink", "size": 1, "mode": 511, "mtime": 9},
    ]
    assert list_entries(docs) == [
        {"name": "a", "size": 3, "type": "file", "mod_time": 7.0},
        {"name": "d", "size": 4096, "type": "directory", "mod_time": 8.0},
    ]


def test_a_streams_end_is_an_exit_code_or_an_http_failure() -> None:
    assert ended(exit_status(0)).exit_code == 0
    assert ended(exit_status(3)).exit_code == 3
    missing = ended(error_status("no such file", 404))
    assert (missing.exit_code, missing.code) == (None, 404)
    assert ended(None).code == 502


def test_discovery_lists_the_routers_subresources() -> None:
    doc = discovery("/apis/router.sandlot.dev/v1alpha1")
    assert doc is not None
    names = {r["name"]: r["verbs"] for r in doc["resources"]}
    assert names["routers/execute"] == ["create"] and names["routers/download"] == ["get"]
    assert discovery("/apis/other") is None
    assert json.dumps(discovery("/apis"))


@pytest.mark.parametrize(
    ("stdout", "exit_code", "workdir"),
    [("/home/user\n", 0, "/home/user"), ("", 127, "/"), ("sh: pwd: oops\n", 0, "/")],
)
def test_the_working_directory_is_what_pwd_printed_else_the_root(
    stdout: str, exit_code: int, workdir: str
) -> None:
    assert workdir_of(execute_answer(stdout.encode(), b"", exit_code, False), 30) == workdir


def test_a_pwd_that_timed_out_is_refused_not_taken_as_the_root() -> None:
    """A sandbox too busy to answer ``pwd`` in time must not send an upload of
    ``work/notes.txt`` to ``/work/notes.txt``."""
    with pytest.raises(RouterError) as refused:
        workdir_of(execute_answer(b"", b"", 124, True), 30)
    assert refused.value.status == 504
    assert "working directory within 30s" in str(refused.value)
