"""``Loops.spawn_due``: a step runs again after the seconds it returns, not after
its (much longer) interval."""

from __future__ import annotations

import threading

from sandlot.agent.loops import Loops

DEADLINE = 60.0


def test_spawn_due_runs_again_when_the_step_says_not_after_the_interval() -> None:
    stop = threading.Event()
    loops = Loops(stop)
    again = threading.Event()
    calls: list[float] = []

    def step() -> float:
        calls.append(1.0)
        if len(calls) == 2:
            again.set()
        return 0.0  # due at once: the interval (an hour) must not be waited

    loops.spawn_due("storage", step, interval=3600.0)
    try:
        assert again.wait(DEADLINE), f"the step ran {len(calls)} time(s) in {DEADLINE}s"
    finally:
        stop.set()
        loops.join(timeout=DEADLINE)
    assert not any(t.is_alive() for t in loops.threads), "the loop did not end on stop"
