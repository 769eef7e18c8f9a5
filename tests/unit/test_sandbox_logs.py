"""Sandbox logs rotate at a size cap and go with their container."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.adapters.logfiles import log_sizes, rotate
from sandlot.policy.sandboxlogs import LogPlan, plan_logs, uid_of


@pytest.mark.parametrize(
    ("name", "uid"),
    [
        ("ns_web_1234-ab.log", "1234-ab"),
        ("ns_web_1234-ab.log.1", "1234-ab"),
        ("ns_my_box_9f.log", "9f"),
        ("notes.txt", None),
        ("nouid.log", None),
    ],
    ids=["log", "rotated", "underscore in name", "other file", "no uid"],
)
def test_uid_of(name: str, uid: str | None) -> None:
    assert uid_of(name) == uid


@pytest.mark.parametrize(
    ("sizes", "live", "cap", "plan"),
    [
        ({"a_b_u1.log": 10}, {"u1"}, 100, LogPlan()),
        ({"a_b_u1.log": 101}, {"u1"}, 100, LogPlan(rotate=["a_b_u1.log"])),
        ({"a_b_u1.log": 101, "a_b_u1.log.1": 500}, {"u1"}, 100, LogPlan(rotate=["a_b_u1.log"])),
        (
            {"a_b_u1.log": 5, "a_b_u1.log.1": 5},
            set(),
            100,
            LogPlan(remove=["a_b_u1.log", "a_b_u1.log.1"]),
        ),
        ({"a_b_u1.log": 10**9}, {"u1"}, 0, LogPlan()),
        ({"README": 10**9}, set(), 100, LogPlan()),
    ],
    ids=[
        "under the cap",
        "over the cap rotates",
        "the previous generation is not rotated again",
        "container gone: both removed",
        "cap 0 never rotates",
        "foreign files are left alone",
    ],
)
def test_plan_logs(sizes: dict[str, int], live: set[str], cap: int, plan: LogPlan) -> None:
    assert plan_logs(sizes, live, cap) == plan


def test_rotation_keeps_one_generation_and_the_writer_appends_at_the_new_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ns_b_u1.log"
    with path.open("ab") as writer:  # the shim's handle: opened once, in append mode
        writer.write(b"x" * 1000)
        writer.flush()
        rotate(path)
        writer.write(b"after")
        writer.flush()
    assert (tmp_path / "ns_b_u1.log.1").read_bytes() == b"x" * 1000
    assert path.read_bytes() == b"after"
    assert log_sizes(tmp_path) == {"ns_b_u1.log": 5, "ns_b_u1.log.1": 1000}


def test_log_sizes_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert log_sizes(tmp_path / "absent") == {}
