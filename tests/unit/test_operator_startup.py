"""The operator starts its parts in one order and stops them in exactly the reverse,
by construction (``controllers.startup.run_parts``); the leadership part lets the
Lease go only once no write of this replica is still in flight."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sandlot.adapters.kube import WriteFence
from sandlot.controllers import operator
from sandlot.controllers.startup import Part, TaskPart, leadership_part, run_parts

OPERATOR_ORDER = ["clients", "health", "events", "informers", "leadership", "kopf", "workers"]
# Generous: a bound on a wait that should end at once, never a timing claim.
DEADLINE = 30.0


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def part(self, name: str, *, fail_start: bool = False, fail_stop: bool = False) -> Part:
        async def start() -> None:
            self.calls.append(f"start {name}")
            if fail_start:
                raise RuntimeError(f"{name} cannot start")

        async def stop() -> None:
            self.calls.append(f"stop {name}")
            if fail_stop:
                raise RuntimeError(f"{name} cannot stop")

        return Part(name, start, stop)


def _serve(calls: list[str]):
    async def serve() -> None:
        calls.append("serve")

    return serve


def test_parts_start_in_order_serve_then_stop_in_reverse():
    rec = Recorder()
    asyncio.run(run_parts([rec.part(n) for n in "abc"], _serve(rec.calls)))
    assert rec.calls == ["start a", "start b", "start c", "serve", "stop c", "stop b", "stop a"]


def test_a_part_that_fails_to_start_stops_only_those_started_before_it():
    rec = Recorder()
    parts = [rec.part("a"), rec.part("b"), rec.part("c", fail_start=True), rec.part("d")]
    with pytest.raises(RuntimeError, match="c cannot start"):
        asyncio.run(run_parts(parts, _serve(rec.calls)))
    assert rec.calls == ["start a", "start b", "start c", "stop b", "stop a"]


def test_a_failing_serve_still_stops_every_part_in_reverse():
    rec = Recorder()

    async def serve() -> None:
        raise RuntimeError("kopf died")

    with pytest.raises(RuntimeError, match="kopf died"):
        asyncio.run(run_parts([rec.part("a"), rec.part("b")], serve))
    assert rec.calls == ["start a", "start b", "stop b", "stop a"]


def test_a_part_that_fails_to_stop_does_not_keep_the_older_ones_running():
    rec = Recorder()
    parts = [rec.part("a"), rec.part("b", fail_stop=True), rec.part("c")]
    with pytest.raises(RuntimeError, match="b cannot stop"):
        asyncio.run(run_parts(parts, _serve(rec.calls)))
    assert rec.calls[-3:] == ["stop c", "stop b", "stop a"]


def test_two_parts_of_one_name_are_refused_before_anything_starts():
    rec = Recorder()
    with pytest.raises(ValueError, match="unique"):
        asyncio.run(run_parts([rec.part("a"), rec.part("a")], _serve(rec.calls)))
    assert rec.calls == []


def test_a_task_part_runs_its_coroutines_until_it_is_stopped():
    ran = []

    async def forever() -> None:
        ran.append("running")
        try:
            await asyncio.Event().wait()
        finally:
            ran.append("cancelled")

    async def main() -> None:
        workers = TaskPart("workers", forever, forever)
        await workers.start()
        await asyncio.sleep(0)  # one turn: both tasks reach their wait
        await workers.stop()
        assert all(t.done() for t in workers.tasks)

    asyncio.run(main())
    assert sorted(ran) == ["cancelled", "cancelled", "running", "running"]


class FakeElector:
    def __init__(self, fence: WriteFence) -> None:
        self.fence = fence
        self.started = False
        self.stopped_with: list[tuple[bool, bool]] = []  # (release, fence open)

    def start(self) -> None:
        self.started = True

    def stop(self, release: bool = True, timeout: float = 5.0) -> None:
        self.stopped_with.append((release, self.fence.open()))


def _write_in_flight(
    fence: WriteFence, *, until_closed: bool
) -> tuple[threading.Thread, threading.Event]:
    """A write holding the fence's permit: it ends once the fence closes, or never
    (until ``finish`` is set by the test, after the stop)."""
    holding, finish = threading.Event(), threading.Event()

    def write() -> None:
        with fence.permit("a status write"):
            holding.set()
            if until_closed:
                while fence.open() and not finish.wait(0.01):
                    pass
            else:
                finish.wait(DEADLINE)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    assert holding.wait(DEADLINE), "the write never got its permit"
    return thread, finish


def test_leadership_stop_releases_the_lease_once_the_writes_in_flight_finished():
    fence = WriteFence(lambda: True)
    elector = FakeElector(fence)
    part = leadership_part(fence, elector, drain_seconds=DEADLINE)
    thread, finish = _write_in_flight(fence, until_closed=True)

    async def main() -> None:
        await part.start()
        await part.stop()

    asyncio.run(main())
    finish.set()
    thread.join(DEADLINE)
    assert elector.started
    assert elector.stopped_with == [(True, False)], "released, with the fence already closed"
    assert fence.in_flight == 0


def test_leadership_stop_keeps_the_lease_while_a_write_is_still_in_flight():
    fence = WriteFence(lambda: True)
    elector = FakeElector(fence)
    # The write below outlives the drain: any drain bound shows it (no timing claim).
    part = leadership_part(fence, elector, drain_seconds=0.05)
    thread, finish = _write_in_flight(fence, until_closed=False)

    async def stop() -> None:
        await part.stop()

    try:
        asyncio.run(stop())
    finally:
        finish.set()
        thread.join(DEADLINE)
    assert elector.stopped_with == [(False, False)], "left to expire, fence closed"


def test_without_election_the_leadership_part_says_so_and_still_closes_the_fence():
    fence = WriteFence(lambda: True)
    said = []
    part = leadership_part(fence, None, on_no_election=lambda: said.append("leader"))

    async def main() -> None:
        await part.start()
        await part.stop()

    asyncio.run(main())
    assert said == ["leader"]
    assert not fence.open()


def test_the_operator_parts_are_in_the_documented_order(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    from prometheus_client import CollectorRegistry

    from sandlot.controllers.settings import OperatorSettings

    async def main() -> list[str]:
        parts = operator.build_parts(
            OperatorSettings(), kubeconfig=str(kubeconfig), registry=CollectorRegistry()
        )
        try:
            assert parts.elector is not None and parts.leadership.elector is parts.elector
            assert not parts.leadership.leading(), "no write before the elector leads"
            return [p.name for p in parts.in_order()]
        finally:
            parts.events.close()
            parts.api.close()
            parts.election_api.close()

    assert asyncio.run(main()) == OPERATOR_ORDER
