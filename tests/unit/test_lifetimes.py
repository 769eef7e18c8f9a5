"""A sandbox's lifetime: the deadline and the decision (pure, a fake clock), and the
controller that ends it at that second over the fake API."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta

import pytest

from sandlot.adapters.objects import rfc3339
from sandlot.controllers.lifetimes import LifetimeController
from sandlot.controllers.sandboxes import SandboxCache
from sandlot.policy.lifetimes import LifetimeDecision, deadline_of, decide_lifetime
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("shutdown", "seconds", "expected"),
    [
        (None, None, None),
        (T0 + timedelta(minutes=5), None, T0 + timedelta(minutes=5)),
        (None, 90, T0 + timedelta(seconds=90)),
        (T0 + timedelta(minutes=5), 90, T0 + timedelta(seconds=90)),
        (T0 + timedelta(seconds=30), 90, T0 + timedelta(seconds=30)),
    ],
    ids=[
        "no_lifetime",
        "shutdown_time_is_absolute",
        "active_deadline_counts_from_creation",
        "earlier_of_both_wins_deadline",
        "earlier_of_both_wins_shutdown",
    ],
)
def test_deadline_of(
    shutdown: datetime | None, seconds: int | None, expected: datetime | None
) -> None:
    assert deadline_of(shutdown, seconds, T0) == expected


@pytest.mark.parametrize(
    ("phase", "deadline", "now", "expected"),
    [
        ("Running", None, T0, LifetimeDecision(expire=False)),
        ("Running", T0 + timedelta(seconds=10), T0, LifetimeDecision(False, 10.0)),
        (
            "Pending",
            T0 + timedelta(seconds=1),
            T0 + timedelta(milliseconds=250),
            LifetimeDecision(False, 0.75),
        ),
        ("Running", T0, T0, LifetimeDecision(True, None, "lifetime ended at 2026-01-01T12:00:00Z")),
        (
            "Scheduled",
            T0,
            T0 + timedelta(hours=1),
            LifetimeDecision(True, None, "lifetime ended at 2026-01-01T12:00:00Z"),
        ),
        ("Stopped", T0, T0 + timedelta(seconds=5), LifetimeDecision(expire=False)),
        ("Dead", T0 + timedelta(seconds=5), T0, LifetimeDecision(expire=False)),
    ],
    ids=[
        "no_deadline_nothing",
        "ahead_waits_exactly_the_rest",
        "pending_waits_fractions_too",
        "at_the_second_expires",
        "long_past_expires",
        "terminal_is_left_alone",
        "terminal_before_its_deadline_is_left_alone",
    ],
)
def test_decide_lifetime(
    phase: str, deadline: datetime | None, now: datetime, expected: LifetimeDecision
) -> None:
    assert decide_lifetime(phase, deadline, now) == expected


class World:
    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.objects = FakeObjects(self.clock.now)
        self.cache = SandboxCache()
        self.leader = True
        self.controller = LifetimeController(
            self.objects,  # type: ignore[arg-type]
            self.cache,
            is_leader=lambda: self.leader,
            clock=self.clock.now,
            queue_clock=self.clock.monotonic,
        )

    def sandbox(self, name: str, phase: str = "Running", **spec: object) -> str:
        body = self.objects.add_sandbox("ns", name, self.clock.now(), node="n1", phase=phase)
        self.objects.sandboxes[f"ns/{name}"]["spec"].update(spec)
        body["spec"].update(spec)
        self.cache.on_event(None, body)
        return f"ns/{name}"

    def run(self) -> None:
        asyncio.run(self.controller.queue.run_until_idle())
        for body in self.objects.sandboxes.values():
            self.cache.on_event("MODIFIED", copy.deepcopy(body))

    def status(self, key: str) -> dict[str, object]:
        return dict(self.objects.sandboxes[key]["status"])


def test_sandbox_ends_stopped_at_its_shutdown_time_to_the_second() -> None:
    w = World()
    key = w.sandbox("job", shutdownTime=rfc3339(T0 + timedelta(seconds=30)))
    w.run()
    assert w.status(key)["phase"] == "Running"
    assert w.controller.queue.due_at(key) == w.clock.monotonic() + 30

    w.clock.advance(29.999)
    w.run()
    assert w.status(key)["phase"] == "Running", "not a moment early"
    w.clock.advance(0.001)
    w.run()
    status = w.status(key)
    assert (status["phase"], status["reason"]) == ("Stopped", "DeadlineExceeded")
    assert status["finishedAt"] == rfc3339(T0 + timedelta(seconds=30))


def test_active_deadline_counts_from_creation_and_ends_a_pending_sandbox_too() -> None:
    w = World()
    key = w.sandbox("waiting", phase="Pending", activeDeadlineSeconds=5)
    w.clock.advance(5)
    w.run()
    assert (w.status(key)["phase"], w.status(key)["reason"]) == ("Stopped", "DeadlineExceeded")


def test_a_standby_writes_nothing_and_a_sandbox_ended_otherwise_is_left_alone() -> None:
    w = World()
    w.leader = False
    key = w.sandbox("job", activeDeadlineSeconds=1)
    w.clock.advance(2)
    w.run()
    assert w.status(key)["phase"] == "Running"
    assert not w.objects.writes

    w.leader = True
    w.objects.sandboxes[key]["status"] = {"phase": "Stopped", "reason": "Exited"}
    w.objects.touch(w.objects.sandboxes[key])
    w.run()
    w.controller.enqueue_all()
    w.run()
    assert w.status(key)["reason"] == "Exited"
