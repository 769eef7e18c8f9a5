"""The write fence: no write of a replica that is not leading is ever sent."""

from __future__ import annotations

import threading

import pytest

from sandlot.adapters.kube import NotLeader, WriteFence


def test_a_write_passes_while_allowed_and_is_refused_the_moment_it_is_not() -> None:
    leading = [True]
    fence = WriteFence(lambda: leading[0])
    sent: list[str] = []
    with fence.permit("PATCH /a"):
        sent.append("a")
    leading[0] = False
    with pytest.raises(NotLeader, match="refused PATCH /b"), fence.permit("PATCH /b"):
        sent.append("b")
    assert sent == ["a"]


def test_close_waits_for_writes_in_flight_and_refuses_new_ones() -> None:
    fence = WriteFence(lambda: True)
    entered, release = threading.Event(), threading.Event()

    def write() -> None:
        with fence.permit("PATCH /slow"):
            entered.set()
            release.wait(10)

    writer = threading.Thread(target=write)
    writer.start()
    assert entered.wait(10), "the write never started"
    assert fence.in_flight == 1
    # While it is in flight, close cannot report drained...
    assert fence.close(timeout=0.05) is False
    # ...and nothing new gets through, even though allowed() still says yes.
    with pytest.raises(NotLeader), fence.permit("PATCH /new"):
        pass
    release.set()
    writer.join(10)
    assert fence.close(timeout=5) is True
    assert fence.in_flight == 0


def test_a_refused_write_is_not_counted_in_flight() -> None:
    fence = WriteFence(lambda: False)
    with pytest.raises(NotLeader), fence.permit("DELETE /x"):
        pass
    assert fence.in_flight == 0
    assert fence.close(timeout=0) is True
