"""The controllers' work queue, driven by a fake clock: no sleeps, no wall-clock waits."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from sandlot.controllers.workqueue import Reconcile, WorkQueue, earliest
from tests.support.clock import FakeClock


class Recorder:
    """A reconcile that records its calls and answers from a script."""

    def __init__(self, answers: dict[str, list[float | Exception | None]] | None = None) -> None:
        self.calls: list[str] = []
        self.answers = answers or {}

    async def __call__(self, key: str) -> float | None:
        self.calls.append(key)
        script = self.answers.get(key)
        answer = script.pop(0) if script else None
        if isinstance(answer, Exception):
            raise answer
        return answer


class Signalling:
    """A reconcile that records each key and sets ``ran`` (a test awaits it)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.ran = asyncio.Event()

    async def __call__(self, key: str) -> float | None:
        self.seen.append(key)
        self.ran.set()
        return None


def make(
    reconcile: Reconcile,
    clock: FakeClock,
    *,
    leader: Callable[[], bool] = lambda: True,
    start: float = 1.0,
    cap: float = 8.0,
) -> WorkQueue:
    return WorkQueue(
        "test",
        reconcile,
        is_leader=leader,
        clock=clock.monotonic,
        backoff_start=start,
        backoff_cap=cap,
    )


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_key_added_many_times_is_reconciled_once() -> None:
    rec = Recorder()
    q = make(rec, FakeClock())
    for _ in range(5):
        q.add("a")
    q.add_all(["b", "a", "b"])
    assert len(q) == 2
    assert run(q.run_until_idle()) == ["a", "b"]
    assert rec.calls == ["a", "b"]


def test_add_after_wakes_at_the_exact_deadline_and_not_before() -> None:
    clock = FakeClock()
    rec = Recorder()
    q = make(rec, clock)
    q.add_after("a", 30.0)
    clock.advance(29.999)
    assert run(q.run_until_idle()) == []
    assert rec.calls == []
    clock.advance(0.001)
    run(q.run_until_idle())
    assert rec.calls == ["a"]


@pytest.mark.parametrize(
    ("first", "second", "due"),
    [(30.0, 2.0, 2.0), (2.0, 30.0, 2.0), (5.0, 5.0, 5.0)],
    ids=["an_earlier_deadline_replaces_a_later_one", "a_later_one_is_ignored", "equal_is_one"],
)
def test_add_after_keeps_the_earliest_deadline(first: float, second: float, due: float) -> None:
    clock = FakeClock()
    rec = Recorder()
    q = make(rec, clock)
    q.add_after("a", first)
    q.add_after("a", second)
    assert q.due_at("a") == clock.monotonic() + due
    clock.advance(due)
    run(q.run_until_idle())
    assert rec.calls == ["a"]
    clock.advance(60.0)
    run(q.run_until_idle())
    assert rec.calls == ["a"], "the replaced deadline must not fire as well"


@pytest.mark.parametrize("delay", [0.0, -10.0], ids=["zero", "already_past"])
def test_a_deadline_not_in_the_future_is_due_now(delay: float) -> None:
    rec = Recorder()
    q = make(rec, FakeClock())
    q.add_after("a", delay)
    run(q.run_until_idle())
    assert rec.calls == ["a"]


def test_the_requeue_after_a_reconcile_returns_is_kept_exactly() -> None:
    clock = FakeClock()
    rec = Recorder({"a": [12.5, None]})
    q = make(rec, clock)
    q.add("a")
    run(q.run_until_idle())
    assert q.due_at("a") == clock.monotonic() + 12.5
    clock.advance(12.5)
    run(q.run_until_idle())
    assert rec.calls == ["a", "a"]
    assert q.due_at("a") is None


def test_forget_drops_the_pending_deadline() -> None:
    clock = FakeClock()
    rec = Recorder()
    q = make(rec, clock)
    q.add_after("a", 5.0)
    q.forget("a")
    clock.advance(10.0)
    assert run(q.run_until_idle()) == []


def test_a_key_is_never_processed_twice_at_once_and_readds_run_once_after() -> None:
    running: list[str] = []
    overlap: list[str] = []
    calls: list[str] = []
    release = asyncio.Event()

    async def reconcile(key: str) -> float | None:
        if key in running:
            overlap.append(key)
        running.append(key)
        calls.append(key)
        if len(calls) == 1:
            await release.wait()
        running.remove(key)
        return None

    async def scenario() -> None:
        q = make(reconcile, FakeClock())
        q.add("a")
        first = asyncio.create_task(q.run_until_idle())
        while not running:  # let the first step start "a"
            await asyncio.sleep(0)
        q.add("a")
        q.add("a")
        assert await q.run_until_idle() == [], "a second step must not take a running key"
        release.set()
        await asyncio.wait_for(first, timeout=5)

    run(scenario())
    assert calls == ["a", "a"]
    assert overlap == []


def test_a_held_key_added_meanwhile_runs_once_when_the_hold_ends() -> None:
    rec = Recorder()
    q = make(rec, FakeClock())
    with q.held("pool", limit=2.0):
        q.add("pool")
        q.add("pool")
        q.add("other")
        assert run(q.run_until_idle()) == ["other"], "only the key not held runs"
    assert rec.calls == ["other"]
    assert run(q.run_until_idle()) == ["pool"]
    assert rec.calls == ["other", "pool"]


def test_a_hold_expires_at_its_limit() -> None:
    clock = FakeClock()
    rec = Recorder()
    q = make(rec, clock)
    with q.held("pool", limit=2.0):
        q.add("pool")
        clock.advance(1.999)
        assert run(q.run_until_idle()) == []
        clock.advance(0.001)
        assert run(q.run_until_idle()) == ["pool"], "held past its limit: released"
    assert rec.calls == ["pool"]
    assert run(q.run_until_idle()) == [], "the end of an expired hold adds nothing"


def test_a_key_stays_held_until_its_last_hold_ends() -> None:
    rec = Recorder()
    q = make(rec, FakeClock())
    with q.held("pool", limit=2.0):
        with q.held("pool", limit=2.0):
            q.add("pool")
        assert run(q.run_until_idle()) == []
    assert run(q.run_until_idle()) == ["pool"]


def test_a_key_already_waiting_is_not_held_back_so_holds_never_starve_it() -> None:
    rec = Recorder()
    q = make(rec, FakeClock())
    q.add("pool")
    with q.held("pool", limit=2.0):
        q.add("pool")
        assert run(q.run_until_idle()) == ["pool"]
    assert run(q.run_until_idle()) == [], "queued once, run once"
    assert rec.calls == ["pool"]


def test_a_key_added_while_it_runs_during_a_hold_runs_again_after_the_hold() -> None:
    calls: list[str] = []
    release = asyncio.Event()

    async def reconcile(key: str) -> float | None:
        calls.append(key)
        if len(calls) == 1:
            await release.wait()
        return None

    async def scenario() -> None:
        q = make(reconcile, FakeClock())
        q.add("pool")
        first = asyncio.create_task(q.run_until_idle())
        while not calls:  # let the first step start "pool"
            await asyncio.sleep(0)
        with q.held("pool", limit=2.0):
            q.add("pool")
            release.set()
            await asyncio.wait_for(first, timeout=5)
            assert await q.run_until_idle() == [], "re-added during the hold: waits for it"
        assert await q.run_until_idle() == ["pool"]

    run(scenario())
    assert calls == ["pool", "pool"]


def test_a_running_queue_wakes_at_a_hold_limit() -> None:
    clock = FakeClock()

    async def scenario() -> list[str]:
        reconcile = Signalling()
        seen, done = reconcile.seen, reconcile.ran
        q = make(reconcile, clock)
        runner = asyncio.create_task(q.run())
        for _ in range(3):  # the runner starts and waits: nothing is due
            await asyncio.sleep(0)
        hold = q.held("pool", limit=0.0)  # expires at once: the waiting runner must notice
        hold.__enter__()
        q.add("pool")
        try:
            await asyncio.wait_for(done.wait(), timeout=5)
        finally:
            runner.cancel()
        hold.__exit__(None, None, None)
        return seen

    assert run(scenario()) == ["pool"]


def test_failures_back_off_exponentially_up_to_the_cap_and_success_resets() -> None:
    clock = FakeClock()
    boom = RuntimeError("boom")
    rec = Recorder({"a": [boom, boom, boom, boom, boom, None, boom]})
    q = make(rec, clock, start=1.0, cap=8.0)
    q.add("a")
    delays = []
    for _ in range(5):
        run(q.run_until_idle())
        due = q.due_at("a")
        assert due is not None
        delays.append(due - clock.monotonic())
        clock.advance(delays[-1])
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    run(q.run_until_idle())  # the sixth call succeeds
    assert q.failures("a") == 0
    assert q.due_at("a") is None
    q.add("a")
    run(q.run_until_idle())  # fails again: back to the first step
    assert q.due_at("a") == clock.monotonic() + 1.0


def test_backoff_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="backoff_start"):
        WorkQueue("test", Recorder(), backoff_start=10.0, backoff_cap=1.0)


def test_work_dequeued_while_not_the_leader_is_dropped() -> None:
    clock = FakeClock()
    leader = [False]
    rec = Recorder()
    q = make(rec, clock, leader=lambda: leader[0])
    q.add("a")
    q.add_after("b", 5.0)
    clock.advance(5.0)
    assert run(q.run_until_idle()) == ["a", "b"], "the standby took no work to drop"
    assert rec.calls == []
    leader[0] = True
    assert run(q.run_until_idle()) == [], "dropped work does not come back by itself"
    q.add_all(["a", "b"])
    run(q.run_until_idle())
    assert rec.calls == ["a", "b"]


def test_watch_threads_hand_keys_to_the_running_queue() -> None:
    async def scenario() -> list[str]:
        seen: list[str] = []
        done = asyncio.Event()

        async def reconcile(key: str) -> float | None:
            seen.append(key)
            if len(seen) == 3:
                done.set()
            return None

        q = make(reconcile, FakeClock())
        runner = asyncio.create_task(q.run())
        await asyncio.sleep(0)  # the runner binds its loop and waits
        threads = [
            threading.Thread(target=q.add_threadsafe, args=(k,), name=f"watch-{k}")
            for k in ("a", "b", "c")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        try:
            await asyncio.wait_for(done.wait(), timeout=5)
        finally:
            runner.cancel()
        return seen

    assert sorted(run(scenario())) == ["a", "b", "c"]


def test_call_threadsafe_runs_on_the_loop_thread() -> None:
    async def scenario() -> tuple[threading.Thread, threading.Thread]:
        loop_thread = threading.current_thread()
        ran_on: list[threading.Thread] = []
        done = asyncio.Event()
        q = make(Recorder(), FakeClock())
        q.bind_loop(asyncio.get_running_loop())

        def note() -> None:
            ran_on.append(threading.current_thread())
            done.set()

        t = threading.Thread(target=q.call_threadsafe, args=(note,), name="watch")
        t.start()
        t.join(5)
        await asyncio.wait_for(done.wait(), timeout=5)
        return loop_thread, ran_on[0]

    loop_thread, ran_on = run(scenario())
    assert ran_on is loop_thread


@pytest.mark.parametrize(
    ("delays", "expected"),
    [((2.0, 300.0), 2.0), ((None, 5.0), 5.0), ((None, None), None), ((0.0, None), 0.0)],
    ids=["the_soonest_wins", "none_is_no_request", "nothing_asked", "zero_is_a_request"],
)
def test_earliest_requeue(delays: tuple[float | None, ...], expected: float | None) -> None:
    assert earliest(*delays) == expected


def test_workers_reconcile_different_keys_at_once_up_to_their_number() -> None:
    async def scenario() -> tuple[int, list[str]]:
        running: set[str] = set()
        peak = 0
        finished: list[str] = []
        release = asyncio.Event()
        all_done = asyncio.Event()

        async def reconcile(key: str) -> float | None:
            nonlocal peak
            running.add(key)
            peak = max(peak, len(running))
            if len(running) == 3:
                release.set()  # three keys are in at once: let them all go
            await asyncio.wait_for(release.wait(), timeout=5)
            running.discard(key)
            finished.append(key)
            if len(finished) == 5:
                all_done.set()
            return None

        q = make(reconcile, FakeClock())
        q.add_all(["a", "b", "c", "d", "e"])
        runner = asyncio.create_task(q.run(workers=3))
        try:
            await asyncio.wait_for(all_done.wait(), timeout=5)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        return peak, finished

    peak, finished = run(scenario())
    assert peak == 3, "three workers must hold three keys at once, and never more"
    assert sorted(finished) == ["a", "b", "c", "d", "e"]


def test_workers_never_reconcile_one_key_twice_at_once() -> None:
    async def scenario() -> tuple[int, int]:
        inside = 0
        overlap = 0
        calls = 0
        second_done = asyncio.Event()
        entered = asyncio.Event()
        q: WorkQueue

        async def reconcile(key: str) -> float | None:
            nonlocal inside, overlap, calls
            calls += 1
            inside += 1
            overlap = max(overlap, inside)
            if calls == 1:
                entered.set()
                q.add(key)  # changed while it runs: it must run once more, after
                for _ in range(5):
                    await asyncio.sleep(0)  # let the other workers look for work
            inside -= 1
            if calls == 2:
                second_done.set()
            return None

        q = make(reconcile, FakeClock())
        q.add("a")
        runner = asyncio.create_task(q.run(workers=4))
        try:
            await asyncio.wait_for(second_done.wait(), timeout=5)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        return overlap, calls

    overlap, calls = run(scenario())
    assert (overlap, calls) == (1, 2)


def test_a_key_wakes_one_idle_worker_not_every_one() -> None:
    async def scenario() -> tuple[int, list[str]]:
        reconcile = Signalling()
        seen, ran = reconcile.seen, reconcile.ran
        q = make(reconcile, FakeClock())
        runner = asyncio.create_task(q.run(workers=16))
        for _ in range(3):  # every worker starts and waits: nothing is queued
            await asyncio.sleep(0)
        try:
            for key in ("a", "b", "c", "d"):
                ran.clear()
                q.add(key)
                await asyncio.wait_for(ran.wait(), timeout=5)
                for _ in range(3):  # let any other woken worker run and wait again
                    await asyncio.sleep(0)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        return q.wakeups, seen

    wakeups, seen = run(scenario())
    assert seen == ["a", "b", "c", "d"]
    assert wakeups == 4, f"{wakeups} worker wake-ups for 4 keys added one at a time"


def test_a_running_queue_reconciles_a_key_at_its_deadline_once() -> None:
    clock = FakeClock()

    async def scenario() -> list[str]:
        reconcile = Signalling()
        seen, ran = reconcile.seen, reconcile.ran
        q = make(reconcile, clock)
        runner = asyncio.create_task(q.run(workers=4))
        await asyncio.sleep(0)
        q.add_after("late", 0.2)
        q.add_after("soon", 0.05)  # earlier: the queue's timer is moved up for it
        try:
            await asyncio.sleep(0.01)
            assert seen == [], "nothing is due before its deadline"
            clock.advance(0.05)
            await asyncio.wait_for(ran.wait(), timeout=5)
            assert seen == ["soon"]
            ran.clear()
            clock.advance(0.15)
            await asyncio.wait_for(ran.wait(), timeout=5)
            for _ in range(3):
                await asyncio.sleep(0)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        return seen

    assert run(scenario()) == ["soon", "late"]


def test_a_resting_key_added_meanwhile_runs_once_when_its_rest_ends() -> None:
    clock = FakeClock()
    rec = Recorder()
    q = WorkQueue("test", rec, clock=clock.monotonic, rest=0.05)
    q.add("pool")
    assert run(q.run_until_idle()) == ["pool"]
    for _ in range(10):  # a storm of events right after a pass
        q.add("pool")
    q.add("other")
    assert run(q.run_until_idle()) == ["other"], "the pool rests; other keys do not wait"
    assert q.due_at("pool") == clock.monotonic() + 0.05
    clock.advance(0.049)
    assert run(q.run_until_idle()) == []
    clock.advance(0.001)
    assert run(q.run_until_idle()) == ["pool"], "the storm's adds make one run"
    clock.advance(1.0)
    q.add("pool")
    assert run(q.run_until_idle()) == ["pool"], "after its rest a key runs at once"
    assert rec.calls == ["pool", "other", "pool", "pool"]


def test_a_key_added_while_it_runs_runs_again_after_its_rest() -> None:
    clock = FakeClock()
    calls: list[str] = []
    q: WorkQueue

    async def reconcile(key: str) -> float | None:
        calls.append(key)
        if len(calls) == 1:
            q.add(key)  # an event while the pass runs
        return None

    q = WorkQueue("test", reconcile, clock=clock.monotonic, rest=0.05)
    q.add("pool")
    assert run(q.run_until_idle()) == ["pool"]
    assert q.due_at("pool") == clock.monotonic() + 0.05
    clock.advance(0.05)
    assert run(q.run_until_idle()) == ["pool"]
    assert calls == ["pool", "pool"]


def test_a_negative_rest_is_refused() -> None:
    with pytest.raises(ValueError, match="rest must be >= 0"):
        WorkQueue("test", Recorder(), rest=-1.0)
