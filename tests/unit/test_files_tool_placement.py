"""The agent places its files tool where runc can mount it: replaced by a rename
only when its bytes differ, so a sandbox's mount never sees a half-written file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandlot.adapters.filetool import TOOL_NAME, place_files_tool
from sandlot.adapters.startup import StartupError


def test_the_tool_is_placed_under_state_dir_executable_and_kept_while_unchanged(
    tmp_path: Path,
) -> None:
    source = tmp_path / "image-tool"
    source.write_bytes(b"\x7fELF one")
    state = tmp_path / "state"
    placed = place_files_tool(str(source), str(state))
    assert placed == str(state / "bin" / TOOL_NAME)
    first = os.stat(placed)
    assert stat.S_IMODE(first.st_mode) == 0o755
    assert Path(placed).read_bytes() == b"\x7fELF one"
    assert place_files_tool(str(source), str(state)) == placed
    assert os.stat(placed).st_ino == first.st_ino, "the same bytes are not written again"
    source.write_bytes(b"\x7fELF two")
    place_files_tool(str(source), str(state))
    assert os.stat(placed).st_ino != first.st_ino, "a new tool is a new file, renamed in"
    assert Path(placed).read_bytes() == b"\x7fELF two"
    assert sorted(p.name for p in (state / "bin").iterdir()) == [TOOL_NAME]


def test_no_tool_configured_places_nothing(tmp_path: Path) -> None:
    assert place_files_tool("", str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []


def test_a_tool_that_cannot_be_read_fails_the_start_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="SANDLOT_FILES_TOOL: cannot place the files tool"):
        place_files_tool(str(tmp_path / "missing"), str(tmp_path))
