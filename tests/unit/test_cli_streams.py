"""``sandlot logs`` / ``sandlot exec`` argument parsing: plain argv in, a request out."""

from __future__ import annotations

import pytest

from sandlot.api.errors import UsageError
from sandlot.cli.main import build_parser, main, split_trailing
from sandlot.cli.streams import exec_request, log_request
from sandlot.policy.streams import EXEC, LOG, StreamRequest


def _args(argv: list[str]):
    words, trailing = split_trailing(argv)
    args = build_parser(words).parse_args(words)
    args.trailing = trailing
    return args


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["logs", "box"], StreamRequest(LOG, "default", "box")),
        (
            ["logs", "box", "-n", "team", "-f", "--tail", "5"],
            StreamRequest(LOG, "team", "box", follow=True, tail=5),
        ),
        (
            ["exec", "box", "-n", "team", "--", "ls", "-l", "--all"],
            StreamRequest(EXEC, "team", "box", command=("ls", "-l", "--all")),
        ),
        (
            ["exec", "-it", "box", "--", "sh", "--", "-x"],
            StreamRequest(EXEC, "default", "box", command=("sh", "--", "-x"), tty=True, stdin=True),
        ),
        (["exec", "box", "echo"], StreamRequest(EXEC, "default", "box", command=("echo",))),
    ],
    ids=[
        "logs",
        "logs-follow-tail",
        "exec-options-after-dashdash",
        "exec-it-inner-dashdash",
        "exec-no-dashdash",
    ],
)
def test_arguments_make_the_request(argv: list[str], expected: StreamRequest) -> None:
    args = _args(argv)
    made = log_request(args) if argv[0] == "logs" else exec_request(args)
    assert made == expected


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["logs", "box", "--previous"], "never restarts"),
        (["logs", "box", "--tail", "-3"], "negative"),
        (["exec", "box"], "needs a command"),
        (["exec", "box", "--"], "needs a command"),
    ],
    ids=["previous-refused", "negative-tail", "exec-without-command", "exec-empty-after-dashdash"],
)
def test_bad_arguments_are_one_clear_line(argv: list[str], complaint: str) -> None:
    args = _args(argv)
    with pytest.raises(UsageError, match=complaint):
        log_request(args) if argv[0] == "logs" else exec_request(args)


def test_previous_exits_2_with_one_line_before_any_connection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["logs", "box", "--previous", "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--previous" in err
