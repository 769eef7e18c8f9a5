"""The idle decision of the agent's exec sessions and log follows: plain numbers
for the last activity, the present and the timeout (``time.monotonic()`` readings
in the agent), no clock and no sleep."""

from __future__ import annotations

import pytest

from sandlot.agent.execsession import idle_past


@pytest.mark.parametrize(
    ("last", "now", "idle", "expected"),
    [
        (100.0, 100.0, 600.0, False),  # just moved
        (100.0, 699.9, 600.0, False),  # a tenth of a second short
        (100.0, 700.0, 600.0, True),  # exactly the timeout
        (100.0, 10_000.0, 600.0, True),  # long past it
        (5.0, 6.5, 2.0, False),
        (5.0, 7.0, 2.0, True),
        (0.0, 0.25, 0.25, True),  # a short timeout works the same
    ],
)
def test_a_stream_is_idle_once_nothing_moved_for_the_timeout(
    last: float, now: float, idle: float, expected: bool
) -> None:
    assert idle_past(last, now, idle) is expected


def test_activity_after_the_present_reading_is_not_idle() -> None:
    # A pump may record activity between the waiter's reading of the clock and its
    # check: a last activity later than "now" is fresh, never idle.
    assert idle_past(101.0, 100.0, 600.0) is False
