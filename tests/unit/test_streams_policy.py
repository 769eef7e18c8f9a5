"""``policy.streams``: what a logs/exec request asks, who may ask it, and its frames."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.policy.streamaccess import (
    Caller,
    RequestHeaderConfig,
    access_review_spec,
    caller_of,
    decide_access,
    requestheader_config,
    resource_attributes,
)
from sandlot.policy.streams import (
    API_PREFIX,
    EXEC,
    LOG,
    RESIZE,
    STDIN,
    StreamRequest,
    StreamRequestError,
    agent_request,
    api_path,
    close_stdin_frame,
    decode_frame,
    encode_frame,
    end_of,
    error_status,
    exit_status,
    parse_agent_request,
    parse_api_request,
    parse_resize,
    resize_frame,
    tail_offset,
)

EXEC_LS = StreamRequest(EXEC, "team", "box", command=("ls", "-l"))
LOG_BOX = StreamRequest(LOG, "team", "box")
BASE = f"{API_PREFIX}/namespaces/team/sandboxes/box"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (f"{BASE}/log", LOG_BOX),
        (f"{BASE}/log?follow=true&tailLines=10", StreamRequest(LOG, "team", "box", True, 10)),
        (
            f"{BASE}/exec?command=sh&command=-c&command=echo+hi&tty=true&stdin=1",
            StreamRequest(
                EXEC, "team", "box", command=("sh", "-c", "echo hi"), tty=True, stdin=True
            ),
        ),
    ],
    ids=["plain-log", "follow-and-tail", "exec-tty-stdin"],
)
def test_a_request_is_read_from_its_api_path_and_query(
    target: str, expected: StreamRequest
) -> None:
    assert parse_api_request(target) == expected


@pytest.mark.parametrize(
    ("target", "complaint"),
    [
        (f"{BASE}/attach", "unknown subresource"),
        ("/metrics", "not under"),
        (f"{API_PREFIX}/namespaces/team/pods/box/exec", "expected"),
        (f"{BASE}/exec", "needs a command"),
        (f"{BASE}/log?tailLines=many", "whole number"),
        (f"{BASE}/log?tailLines=-1", "negative"),
    ],
    ids=[
        "unknown-subresource",
        "other-path",
        "other-resource",
        "exec-without-command",
        "tail-not-a-number",
        "tail-negative",
    ],
)
def test_a_bad_request_is_refused_with_what_is_wrong(target: str, complaint: str) -> None:
    with pytest.raises(StreamRequestError, match=complaint):
        parse_api_request(target)


ROUND_TRIPS = [
    LOG_BOX,
    StreamRequest(LOG, "team", "box", follow=True, tail=0),
    StreamRequest(EXEC, "team", "box", command=("sh", "-c", "a && b; c=$d"), tty=True),
]


@pytest.mark.parametrize("request_", ROUND_TRIPS, ids=["log", "follow-tail-zero", "exec-shell"])
def test_the_cli_writes_what_the_gateway_reads(request_: StreamRequest) -> None:
    assert parse_api_request(api_path(request_)) == request_


@pytest.mark.parametrize("request_", ROUND_TRIPS, ids=["log", "follow-tail-zero", "exec-shell"])
def test_the_gateway_writes_what_the_agent_reads(request_: StreamRequest) -> None:
    assert parse_agent_request(*agent_request(request_)) == request_


def test_the_exec_command_is_in_the_query_so_the_audit_log_records_it() -> None:
    path = api_path(StreamRequest(EXEC, "team", "box", command=("rm", "-rf", "/tmp/x")))
    assert path == f"{BASE}/exec?command=rm&command=-rf&command=%2Ftmp%2Fx"


@pytest.mark.parametrize(
    ("request_", "verb"),
    [(EXEC_LS, "create"), (LOG_BOX, "get")],
    ids=["exec-is-create-sandboxes-exec", "logs-is-get-sandboxes-log"],
)
def test_the_verbs_asked_are_those_of_kubectl_exec_and_logs(
    request_: StreamRequest, verb: str
) -> None:
    attributes = resource_attributes(request_)
    assert attributes["verb"] == verb
    assert attributes["subresource"] == request_.kind
    assert (attributes["group"], attributes["resource"]) == (
        "subresources.sandlot.dev",
        "sandboxes",
    )
    assert (attributes["namespace"], attributes["name"]) == ("team", "box")


def test_the_access_review_asks_for_the_named_user_whole() -> None:
    caller = Caller("ann", ("dev",), {"scopes": ("a",)}, "u-1")
    spec = access_review_spec(caller, EXEC_LS)
    assert (spec["user"], spec["uid"], spec["groups"], spec["extra"]) == (
        "ann",
        "u-1",
        ["dev"],
        {"scopes": ["a"]},
    )


CONFIG = RequestHeaderConfig(allowed_names=("front-proxy-client",))
HEADERS = [
    ("X-Remote-User", "ann"),
    ("X-Remote-Group", "dev"),
    ("x-remote-group", "system:authenticated"),
    ("X-Remote-Extra-Scopes", "a"),
    ("X-Remote-Extra-Acme.com%2fproject", "p1"),
]


@pytest.mark.parametrize(
    ("headers", "proxy", "expected"),
    [
        (
            HEADERS,
            "front-proxy-client",
            Caller(
                "ann",
                ("dev", "system:authenticated"),
                {"scopes": ("a",), "acme.com/project": ("p1",)},
            ),
        ),
        (HEADERS, "someone-else", None),
        (HEADERS, "", None),
        ([("X-Remote-Group", "dev")], "front-proxy-client", None),
    ],
    ids=["from-the-front-proxy", "another-certificate", "no-certificate", "no-user"],
)
def test_the_user_is_believed_only_from_the_front_proxys_certificate(
    headers: list[tuple[str, str]], proxy: str, expected: Caller | None
) -> None:
    assert caller_of(headers, CONFIG, proxy) == expected


def test_the_header_names_come_from_the_api_servers_configmap() -> None:
    config = requestheader_config(
        {
            "requestheader-username-headers": '["X-User"]',
            "requestheader-group-headers": '["X-Group"]',
            "requestheader-extra-headers-prefix": '["X-Extra-"]',
            "requestheader-allowed-names": '["proxy"]',
        }
    )
    caller = caller_of([("X-User", "bob"), ("X-Group", "g"), ("X-Extra-k", "v")], config, "proxy")
    assert caller == Caller("bob", ("g",), {"k": ("v",)})
    with pytest.raises(ValueError, match="requestheader-allowed-names"):
        requestheader_config({"requestheader-allowed-names": '"proxy"'})


ANN = Caller("ann")


@pytest.mark.parametrize(
    ("caller", "access_review", "allowed", "code", "says"),
    [
        (None, None, False, 401, "front proxy"),
        (ANN, {"allowed": False}, False, 403, 'user "ann" cannot create sandboxes/exec'),
        (ANN, {"allowed": True, "denied": True, "reason": "policy"}, False, 403, "policy"),
        (ANN, None, False, 403, "not reviewed"),
        (ANN, {"allowed": True}, True, 200, 'user "ann" may create sandboxes/exec'),
    ],
    ids=["no-user", "not-allowed", "denied-wins-over-allowed", "not-reviewed", "allowed"],
)
def test_access_needs_a_named_user_and_an_allowed_review(
    caller: Caller | None,
    access_review: dict[str, Any] | None,
    allowed: bool,
    code: int,
    says: str,
) -> None:
    access = decide_access(caller, access_review, EXEC_LS)
    assert (access.allowed, access.code) == (allowed, code)
    assert says in access.message


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
