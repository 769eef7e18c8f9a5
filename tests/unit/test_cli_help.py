"""Every ``--help`` of every (sub)command reads as text a person wrote: a required
setting says ``required``, never pydantic's ``PydanticUndefined`` sentinel."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from sandlot.cli.main import build_parser


def every_parser(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(("sandlot", *path)), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, (*path, name))


PARSERS = dict(every_parser(build_parser([])))


def test_every_command_is_walked() -> None:
    # The walk must reach nested commands, or the test below checks too little.
    assert {"sandlot agent", "sandlot operator", "sandlot cache clear containerd"} <= set(PARSERS)


@pytest.mark.parametrize("command", sorted(PARSERS), ids=sorted(PARSERS))
def test_help_has_no_pydantic_sentinel(command: str) -> None:
    text = PARSERS[command].format_help()
    assert "PydanticUndefined" not in text, text
    assert "Undefined" not in text, text


def test_required_setting_says_required() -> None:
    text = " ".join(PARSERS["sandlot agent"].format_help().split())
    assert "SANDLOT_NODE_NAME; required]" in text, text
