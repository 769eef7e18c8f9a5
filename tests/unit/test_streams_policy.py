"""``policy.streams``: what a logs/exec request asks, who may ask it, and its frames."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.policy.streams import (
    EXEC,
    LOG,
    RESIZE,
    STDIN,
    StreamRequest,
    StreamRequestError,
    access_review_spec,
    bearer_token,
    close_stdin_frame,
    decide_access,
    decode_frame,
    encode_frame,
    end_of,
    error_status,
    exit_status,
    parse_resize,
    parse_stream_request,
    proxy_path,
    resize_frame,
    resource_attributes,
    stream_path,
    tail_offset,
)

EXEC_LS = StreamRequest(EXEC, "team", "box", command=("ls", "-l"))
LOG_BOX = StreamRequest(LOG, "team", "box")


@pytest.mark.parametrize(
    ("path", "options", "expected"),
    [
        ("/sandboxes/team/box/log", "", LOG_BOX),
        (
            "/sandboxes/team/box/log",
            "follow=true&tail=10",
            StreamRequest(LOG, "team", "box", follow=True, tail=10),
        ),
        (
            "/sandboxes/team/box/exec",
            "command=sh&command=-c&command=echo+hi&tty=true&stdin=1",
            StreamRequest(
                EXEC, "team", "box", command=("sh", "-c", "echo hi"), tty=True, stdin=True
            ),
        ),
        ("/sandboxes/team/box/log?tail=3", "", LOG_BOX),
    ],
    ids=["plain-log", "follow-and-tail", "exec-tty-stdin", "query-on-the-path-ignored"],
)
def test_a_request_is_read_from_its_path_and_options_header(
    path: str, options: str, expected: StreamRequest
) -> None:
    assert parse_stream_request(path, options) == expected


@pytest.mark.parametrize(
    ("path", "options", "complaint"),
    [
        ("/sandboxes/team/box/attach", "", "unknown path"),
        ("/metrics", "", "unknown path"),
        ("/sandboxes/team/box/exec", "", "needs a command"),
        ("/sandboxes/team/box/log", "tail=many", "whole number"),
        ("/sandboxes/team/box/log", "tail=-1", "negative"),
    ],
    ids=[
        "unknown-verb",
        "other-path",
        "exec-without-command",
        "tail-not-a-number",
        "tail-negative",
    ],
)
def test_a_bad_request_is_refused_with_what_is_wrong(
    path: str, options: str, complaint: str
) -> None:
    with pytest.raises(StreamRequestError, match=complaint):
        parse_stream_request(path, options)


@pytest.mark.parametrize(
    "request_",
    [
        LOG_BOX,
        StreamRequest(LOG, "team", "box", follow=True, tail=0),
        StreamRequest(EXEC, "team", "box", command=("sh", "-c", "a && b; c=$d"), tty=True),
    ],
    ids=["log", "follow-tail-zero", "exec-shell-line"],
)
def test_the_cli_writes_what_the_agent_reads(request_: StreamRequest) -> None:
    assert parse_stream_request(*stream_path(request_)) == request_


@pytest.mark.parametrize(
    ("request_", "verb", "subresource"),
    [(EXEC_LS, "exec", None), (LOG_BOX, "get", "log")],
    ids=["exec-is-verb-exec", "logs-is-get-sandboxes-log"],
)
def test_the_verbs_asked_are_exec_and_get_log_on_sandboxes(
    request_: StreamRequest, verb: str, subresource: str | None
) -> None:
    attributes = resource_attributes(request_)
    assert attributes["verb"] == verb
    assert attributes.get("subresource") == subresource
    assert (attributes["group"], attributes["resource"]) == ("sandlot.dev", "sandboxes")
    assert (attributes["namespace"], attributes["name"]) == ("team", "box")


def test_the_access_review_asks_for_the_reviewed_identity_whole() -> None:
    user = {"username": "ann", "uid": "u-1", "groups": ["dev"], "extra": {"scopes": ["a"]}}
    spec = access_review_spec(user, EXEC_LS)
    assert (spec["user"], spec["uid"], spec["groups"], spec["extra"]) == (
        "ann",
        "u-1",
        ["dev"],
        {"scopes": ["a"]},
    )


AUTHENTICATED = {"authenticated": True, "user": {"username": "ann"}}


@pytest.mark.parametrize(
    ("token", "token_review", "access_review", "allowed", "code", "says"),
    [
        (None, None, None, False, 401, "no bearer token"),
        ("t", {"authenticated": False, "error": "expired"}, None, False, 401, "expired"),
        ("t", AUTHENTICATED, {"allowed": False}, False, 403, 'user "ann" cannot exec in'),
        (
            "t",
            AUTHENTICATED,
            {"allowed": True, "denied": True, "reason": "policy"},
            False,
            403,
            "policy",
        ),
        ("t", AUTHENTICATED, None, False, 403, "not reviewed"),
        ("t", AUTHENTICATED, {"allowed": True}, True, 200, 'user "ann" may exec'),
    ],
    ids=[
        "no-token",
        "token-not-authenticated",
        "not-allowed",
        "denied-wins-over-allowed",
        "access-not-reviewed",
        "allowed",
    ],
)
def test_access_needs_an_authenticated_token_and_an_allowed_review(
    token: str | None,
    token_review: dict[str, Any] | None,
    access_review: dict[str, Any] | None,
    allowed: bool,
    code: int,
    says: str,
) -> None:
    access = decide_access(token, token_review, access_review, EXEC_LS)
    assert (access.allowed, access.code) == (allowed, code)
    assert says in access.message


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("", None), (None, None)],
    ids=["bearer", "case-and-spaces", "other-scheme", "empty", "absent"],
)
def test_only_a_bearer_token_is_taken(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_frames_carry_their_channel_first() -> None:
    assert encode_frame(1, b"out") == b"\x01out"
    assert decode_frame(b"\x02err") == (2, b"err")
    assert close_stdin_frame() == bytes([255, STDIN])
    channel, data = decode_frame(resize_frame(120, 40))
    assert (channel, parse_resize(data)) == (RESIZE, (120, 40))
    with pytest.raises(ValueError):
        decode_frame(b"")
    with pytest.raises(ValueError):
        encode_frame(256, b"")


@pytest.mark.parametrize(
    "data",
    [b"{}", b"not json", b'{"Width": 0, "Height": 10}', b'{"Width": 70000, "Height": 10}'],
    ids=["missing-fields", "not-json", "zero-width", "too-wide"],
)
def test_a_bad_resize_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_resize(data)


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (exit_status(0), 0, ""),
        (exit_status(7), 7, ""),
        (error_status("no such container"), 1, "no such container"),
        (None, 1, "before the command's exit status"),
        (b"garbage", 1, "unreadable"),
    ],
    ids=["success", "exit-code-7", "stream-error", "no-status", "unreadable-status"],
)
def test_the_status_message_becomes_the_exit_code(
    status: bytes | None, code: int, message: str
) -> None:
    end = end_of(status)
    assert end.exit_code == code
    assert message in end.message


LINES = b"one\ntwo\nthree\n"


@pytest.mark.parametrize(
    ("data", "size", "lines", "offset"),
    [
        (LINES, len(LINES), 2, 4),
        (LINES, len(LINES), 0, len(LINES)),
        (LINES, len(LINES), 10, 0),
        (b"one\ntwo\npartial", 15, 1, 8),
        (b"two\nthree\n", 100, 1, 94),
        (b"", 0, 3, 0),
    ],
    ids=[
        "last-two",
        "none",
        "more-than-there-are",
        "partial-last-line-counts",
        "window-of-a-larger-file",
        "empty-file",
    ],
)
def test_tail_starts_at_the_nth_line_from_the_end(
    data: bytes, size: int, lines: int, offset: int
) -> None:
    assert tail_offset(data, size, lines) == offset


def test_the_proxy_path_is_the_pods_proxy_of_the_agents_pod() -> None:
    assert (
        proxy_path("sandlot-system", "agent-x", 10350)
        == "/api/v1/namespaces/sandlot-system/pods/agent-x:10350/proxy"
    )
