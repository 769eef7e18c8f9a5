"""Sandbox logs: capped as they are written, read from the tasks' FIFOs, and gone
with their container. Plans are plain data; the files and FIFOs are real ones in
a temporary directory (the agent's own code, no containerd)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from sandlot.adapters.logfiles import CappedLog, fifo_stems, log_files
from sandlot.agent.logwriter import LogWriter
from sandlot.policy.sandboxlogs import LogPlan, fits, log_stem, plan_logs, uid_of
from tests.support.wait import wait_for


@pytest.mark.parametrize(
    ("name", "uid"),
    [
        ("ns_web_1234-ab.log", "1234-ab"),
        ("ns_web_1234-ab.log.1", "1234-ab"),
        ("ns_web_1234-ab.fifo", "1234-ab"),
        ("ns_my_box_9f.log", "9f"),
        ("notes.txt", None),
        ("nouid.log", None),
    ],
    ids=["log", "rotated", "fifo", "underscore in name", "other file", "no uid"],
)
def test_uid_of(name: str, uid: str | None) -> None:
    assert uid_of(name) == uid
    assert uid_of(log_stem("ns", "web", "1234-ab") + ".log") == "1234-ab"


@pytest.mark.parametrize(
    ("size", "incoming", "cap", "fit"),
    [
        (0, 10, 100, 10),
        (95, 10, 100, 5),
        (100, 10, 100, 0),
        (150, 10, 100, 0),  # a file found over a smaller cap after a restart
        (10**9, 10, 0, 10),
    ],
    ids=["fits", "fills to the cap", "full", "over", "no cap"],
)
def test_fits(size: int, incoming: int, cap: int, fit: int) -> None:
    assert fits(size, incoming, cap) == fit


LOGS = {
    # (files, fifos, attached, container uids, uids whose logs stay) -> plan
    "running and read: nothing to do": (
        {"a_b_u1.log"},
        {"a_b_u1"},
        {"a_b_u1": 3},
        {"u1"},
        {"u1"},
        LogPlan(),
    ),
    "running and not read (a restarted agent): attach": (
        set(),
        {"a_b_u1"},
        {},
        {"u1"},
        {"u1"},
        LogPlan(attach=["a_b_u1"]),
    ),
    "sandbox gone with its container: read the rest, then remove both files": (
        {"a_b_u1.log", "a_b_u1.log.1"},
        {"a_b_u1"},
        {"a_b_u1": 3},
        set(),
        set(),
        LogPlan(detach={"a_b_u1": 3}, remove=["a_b_u1.log", "a_b_u1.log.1"]),
    ),
    "container gone while no agent read: unlink the FIFO": (
        set(),
        {"a_b_u1"},
        {},
        set(),
        set(),
        LogPlan(detach={"a_b_u1": None}),
    ),
    "foreign files are left alone": ({"README", "x.log"}, set(), {}, set(), set(), LogPlan()),
    "a next file left by an agent stopped mid-rotation goes with its sandbox": (
        {"a_b_u1.log.new"},
        set(),
        {},
        set(),
        set(),
        LogPlan(remove=["a_b_u1.log.new"]),
    ),
    "suspended (no container on purpose): its output detached, its files kept": (
        {"a_b_u1.log", "a_b_u1.log.1"},
        {"a_b_u1"},
        {"a_b_u1": 3},
        set(),
        {"u1"},
        LogPlan(detach={"a_b_u1": 3}),
    ),
    "sandboxes not known yet: nothing removed": (
        {"a_b_u1.log"},
        set(),
        {},
        set(),
        None,
        LogPlan(),
    ),
    "ended and its container gone: removed": (
        {"a_b_u1.log"},
        set(),
        {},
        set(),
        {"u2"},
        LogPlan(remove=["a_b_u1.log"]),
    ),
}


@pytest.mark.parametrize(
    ("files", "fifos", "attached", "live", "kept", "plan"), LOGS.values(), ids=list(LOGS)
)
def test_plan_logs(
    files: set[str],
    fifos: set[str],
    attached: dict[str, int],
    live: set[str],
    kept: set[str] | None,
    plan: LogPlan,
) -> None:
    assert plan_logs(files, fifos, attached, live, kept) == plan


def test_a_capped_log_is_never_over_its_cap_and_keeps_one_generation(tmp_path: Path) -> None:
    path = tmp_path / "ns_b_u1.log"
    log = CappedLog(path, max_bytes=1000)
    rng = random.Random(7)
    written = b""
    for _ in range(200):
        chunk = bytes([rng.randrange(97, 123)]) * rng.randrange(1, 700)
        log.write(chunk)
        written += chunk
        assert path.stat().st_size <= 1000, "the log went over its cap"
    rotated = (tmp_path / "ns_b_u1.log.1").read_bytes()
    assert len(rotated) == 1000
    assert written.endswith(rotated + path.read_bytes())  # nothing lost at either seam
    log.close()
    again = CappedLog(path, max_bytes=1000)  # a restarted agent goes on where it was
    assert again.size == path.stat().st_size


def test_a_rotation_leaves_a_file_at_the_log_path_at_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower that finds the path missing ends as if the sandbox were gone: each
    file operation of a rotation is checked to leave the path in place."""
    path = tmp_path / "ns_b_u1.log"
    log = CappedLog(path, max_bytes=10)
    steps: list[str] = []
    for name in ("unlink", "link", "open", "replace", "close", "rename"):
        real = getattr(os, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kw: object) -> object:
            result = _real(*args, **kw)  # type: ignore[operator]
            steps.append(_name)
            assert path.exists(), f"the log path was missing after os.{_name}{args}"
            return result

        monkeypatch.setattr(os, name, spy)
    log.write(b"0123456789abcdefghijklmnopqrstu")
    monkeypatch.undo()
    assert {"link", "replace"} <= set(steps), f"no rotation happened: {steps}"
    assert (tmp_path / "ns_b_u1.log.1").read_bytes() == b"klmnopqrst"
    assert path.read_bytes() == b"u"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ns_b_u1.log", "ns_b_u1.log.1"]
    log.close()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # not made yet by the writer's thread
        return None


def _writer(tmp_path: Path, cap: int = 10**6) -> LogWriter:
    return LogWriter(tmp_path / "logs", tmp_path / "fifos", cap)


def test_the_writer_moves_a_tasks_output_from_its_fifo_into_the_capped_log(
    tmp_path: Path,
) -> None:
    writer = _writer(tmp_path, cap=4096)
    writer.start()
    try:
        fifo = writer.attach("ns_b_u1")
        task = os.open(fifo, os.O_WRONLY)  # the shim's end
        os.write(task, b"x" * 10_000)
        log = writer.log_path("ns_b_u1")
        rotated = log.with_name("ns_b_u1.log.1")

        def size(path: Path) -> int | None:
            try:
                return path.stat().st_size
            except FileNotFoundError:  # between the rename and the new file
                return None

        wait_for(
            lambda: size(rotated) == 4096 and size(log) == 10_000 - 2 * 4096,
            timeout=10,
            what="10,000 bytes in the log and its previous generation",
        )
        assert rotated.stat().st_size == 4096
        os.close(task)
    finally:
        writer.stop()


def test_detach_writes_what_is_left_and_unlinks_the_fifo(tmp_path: Path) -> None:
    writer = _writer(tmp_path)  # not started: only detach reads
    fifo = writer.attach("ns_b_u1")
    task = os.open(fifo, os.O_WRONLY)
    os.write(task, b"last words\n")
    os.close(task)
    token = writer.attached()["ns_b_u1"]
    assert writer.detach("ns_b_u1", token)
    assert writer.log_path("ns_b_u1").read_bytes() == b"last words\n"
    assert not Path(fifo).exists()
    assert writer.attached() == {}
    writer.stop()


def test_a_detach_planned_before_a_new_attach_keeps_it(tmp_path: Path) -> None:
    """The log pass planned a detach; the sandbox's new task attached meanwhile."""
    writer = _writer(tmp_path)
    writer.attach("ns_b_u1")
    planned = writer.attached()["ns_b_u1"]
    fifo = writer.attach("ns_b_u1")
    assert not writer.detach("ns_b_u1", planned)
    assert Path(fifo).exists() and "ns_b_u1" in writer.attached()
    assert not writer.detach("ns_b_u1", None)  # "not attached" was planned: kept too
    writer.stop()


def test_output_written_while_no_agent_reads_reaches_the_log_of_the_next(tmp_path: Path) -> None:
    """An agent restart: the task keeps its end of the FIFO; what it writes meanwhile
    waits in the pipe, and the next agent's attach takes it."""
    first = _writer(tmp_path)
    first.start()
    fifo = first.attach("ns_b_u1")
    task = os.open(fifo, os.O_WRONLY)
    # containerd's shim holds a reader it never reads: its writes never fail for want
    # of one (they wait in the pipe instead).
    holder = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    os.write(task, b"before\n")
    log = first.log_path("ns_b_u1")
    wait_for(lambda: _read(log) == b"before\n", timeout=10, what="'before' in the log")
    first.stop()
    os.write(task, b"between\n")  # nobody reads
    assert fifo_stems(tmp_path / "fifos") == {"ns_b_u1"}
    second = _writer(tmp_path)
    second.start()
    try:
        second.attach("ns_b_u1")
        os.write(task, b"after\n")
        wait_for(
            lambda: _read(log) == b"before\nbetween\nafter\n",
            timeout=10,
            what="all three lines in the log, in order",
        )
    finally:
        os.close(task)
        os.close(holder)
        second.stop()
    assert log_files(tmp_path / "logs") == {"ns_b_u1.log"}
