"""The agent's decisions about a sandbox's executor, and the bounds it holds every
frame of the executor to (``policy.executor``), on a fake clock."""

from __future__ import annotations

import itertools

import pytest

from sandlot.policy.backoff import capped_doubling
from sandlot.policy.executor import (
    EOF,
    EXIT,
    HEADER,
    MAX_PAYLOAD,
    READY,
    START,
    STDOUT,
    Choice,
    ExecutorRecord,
    Fallback,
    FrameError,
    Path,
    choose_path,
    died,
    encode,
    forgettable,
    read_header,
    started,
)

T0 = 1000.0


@pytest.mark.parametrize(
    ("record", "now", "mounted", "running", "expected"),
    [
        (ExecutorRecord(), T0, False, False, Choice(Path.RUNTIME, Fallback.ABSENT)),
        (ExecutorRecord(), T0, True, True, Choice(Path.EXECUTOR)),
        (ExecutorRecord(), T0, True, False, Choice(Path.START)),
        (ExecutorRecord(1, T0), T0 + 0.5, True, False, Choice(Path.RUNTIME, Fallback.BACKOFF)),
        (ExecutorRecord(1, T0), T0 + 1.0, True, False, Choice(Path.START)),
        (ExecutorRecord(3, T0), T0 + 3.9, True, False, Choice(Path.RUNTIME, Fallback.BACKOFF)),
        (ExecutorRecord(3, T0), T0 + 4.0, True, False, Choice(Path.START)),
        (ExecutorRecord(50, T0), T0 + 59.0, True, False, Choice(Path.RUNTIME, Fallback.BACKOFF)),
        (ExecutorRecord(50, T0), T0 + 60.0, True, False, Choice(Path.START)),
    ],
    ids=[
        "no-executor-in-the-sandbox",
        "running",
        "first-command-starts-it",
        "first-death-waits-a-second",
        "first-death-restarts-after-a-second",
        "third-death-waits-four",
        "third-death-restarts-after-four",
        "many-deaths-wait-the-cap",
        "many-deaths-restart-at-the-cap",
    ],
)
def test_a_command_s_way_follows_the_executor_s_state_and_its_back_off(
    record: ExecutorRecord, now: float, mounted: bool, running: bool, expected: Choice
) -> None:
    assert choose_path(record, now, mounted=mounted, running=running) == expected


def test_a_tenant_killing_its_executor_in_a_loop_gets_restarts_at_a_capped_rate() -> None:
    now, record, starts = T0, ExecutorRecord(), []
    while now < T0 + 600:  # a command every 100 ms; each started executor dies at once
        if choose_path(record, now, mounted=True, running=False).path is Path.START:
            starts.append(now)
            record = died(started(record, now), now)
        now = round(now + 0.1, 1)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[:6] == pytest.approx([1, 2, 4, 8, 16, 32], abs=0.11)
    assert all(g == pytest.approx(60, abs=0.11) for g in gaps[6:]), gaps
    assert len(starts) <= 16


def test_an_executor_that_lived_a_while_counts_its_death_as_the_first() -> None:
    record = ExecutorRecord(deaths=5, last_death=T0)
    assert died(started(record, T0 + 100), T0 + 100 + 59).deaths == 6
    assert died(started(record, T0 + 100), T0 + 100 + 60).deaths == 1


def test_the_back_off_is_the_project_s_capped_doubling() -> None:
    for deaths in range(1, 12):
        record = ExecutorRecord(deaths, T0)
        wait = capped_doubling(deaths, 1.0, 60.0)
        assert choose_path(record, T0 + wait - 0.01, mounted=True, running=False).reason is (
            Fallback.BACKOFF
        )
        assert choose_path(record, T0 + wait, mounted=True, running=False).path is Path.START


@pytest.mark.parametrize(
    ("record", "now", "expected"),
    [
        (ExecutorRecord(), T0, True),
        (ExecutorRecord(3, T0), T0 + 59, False),
        (ExecutorRecord(3, T0), T0 + 60, True),
    ],
    ids=["never-died", "within-its-back-off", "long-after"],
)
def test_a_record_is_forgotten_once_it_says_nothing(
    record: ExecutorRecord, now: float, expected: bool
) -> None:
    assert forgettable(record, now) is expected


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (HEADER.pack(START, 1, 0), "unknown kind"),
        (HEADER.pack(STDOUT, 1, MAX_PAYLOAD + 1), "more than"),
        (HEADER.pack(EXIT, 1, 8), "not 4"),
        (HEADER.pack(EOF, 1, 0), "not 1"),
        (HEADER.pack(READY, 3, 14), "for session 3"),
        (HEADER.pack(STDOUT, 0, 1), "for session 0"),
        (HEADER.pack(99, 1, 1), "unknown kind"),
    ],
    ids=[
        "an-agent-s-kind",
        "oversized",
        "exit-of-the-wrong-length",
        "eof-without-its-stream",
        "hello-on-a-session",
        "output-on-session-zero",
        "unknown-kind",
    ],
)
def test_a_frame_the_executor_may_not_send_is_refused_before_its_payload_is_read(
    header: bytes, why: str
) -> None:
    with pytest.raises(FrameError, match=why):
        read_header(header)


def test_a_frame_within_bounds_is_read_back() -> None:
    frame = encode(STDOUT, 7, b"x" * MAX_PAYLOAD)
    assert read_header(frame[: HEADER.size]) == (STDOUT, 7, MAX_PAYLOAD)
    with pytest.raises(ValueError, match="more than"):
        encode(STDOUT, 7, b"x" * (MAX_PAYLOAD + 1))
