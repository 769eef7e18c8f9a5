"""What the agent reads of a tool's answer inside a sandbox (``agent.containerfiles``,
files under a runtime with no host view) is capped: the tool is the tenant's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandlot.adapters.sandboxfs import FileRefused
from sandlot.agent.containerfiles import STAT_LINE_MAX, collect


def endless() -> Iterator[bytes]:
    while True:
        yield b"x" * 65536


def test_an_answer_within_the_cap_is_joined() -> None:
    assert collect(iter([b"ab", b"cd"]), 4, "/p") == b"abcd"


def test_an_endless_answer_is_refused_at_the_cap_naming_the_path() -> None:
    with pytest.raises(FileRefused) as refused:
        collect(endless(), STAT_LINE_MAX, "/tmp/x")
    assert refused.value.status == 413
    assert "/tmp/x" in str(refused.value) and str(STAT_LINE_MAX) in str(refused.value)
