"""A Sandbox whose status write failed is left alone for a while: refused writes
are not retried every pass, and an edit of the object ends the hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.policy.writebackoff import (
    REFUSED_BASE,
    REFUSED_CAP,
    TRANSIENT_BASE,
    TRANSIENT_CAP,
    Hold,
    is_held,
    next_hold,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _after(failures: int, *, refused: bool, version: str = "v1") -> Hold:
    hold = None
    for _ in range(failures):
        hold = next_hold(hold, version, T0, refused=refused)
    assert hold is not None
    return hold


@pytest.mark.parametrize(
    ("failures", "refused", "delay"),
    [
        (1, True, REFUSED_BASE),
        (2, True, REFUSED_BASE * 2),
        (3, True, REFUSED_BASE * 4),
        (40, True, REFUSED_CAP),
        (1, False, TRANSIENT_BASE),
        (3, False, TRANSIENT_BASE * 4),
        (40, False, TRANSIENT_CAP),
    ],
    ids=[
        "refused once",
        "refused twice doubles",
        "refused three times",
        "refused often is capped",
        "transient once",
        "transient three times",
        "transient often is capped",
    ],
)
def test_delay_doubles_up_to_a_cap(failures: int, refused: bool, delay: timedelta) -> None:
    assert _after(failures, refused=refused).until == T0 + delay


@pytest.mark.parametrize(
    ("version", "at", "held"),
    [
        ("v1", T0, True),
        ("v1", T0 + REFUSED_BASE - timedelta(milliseconds=1), True),
        ("v1", T0 + REFUSED_BASE, False),
        ("v2", T0, False),
    ],
    ids=["right after", "just before the end", "at the end", "edited meanwhile"],
)
def test_held_while_unchanged_and_the_delay_runs(version: str, at: datetime, held: bool) -> None:
    assert is_held(_after(1, refused=True), version, at) is held


def test_no_hold_no_wait() -> None:
    assert is_held(None, "v1", T0) is False


def test_a_failure_on_an_edited_object_starts_over() -> None:
    hold = next_hold(_after(5, refused=True), "v2", T0, refused=True)
    assert hold.failures == 1 and hold.until == T0 + REFUSED_BASE
