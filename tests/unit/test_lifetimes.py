"""A sandbox's lifetime: the deadline and the decision (pure, a fake clock), and the
controller that ends it at that second over the fake API."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta

import pytest

from sandlot.api.timestamps import rfc3339
from sandlot.controllers.lifetimes import LifetimeController
from sandlot.controllers.sandboxes import SandboxCache
from sandlot.policy.lifetimes import (
    Due,
    Ending,
    LifetimeDecision,
    after_finish,
    deadline_of,
    decide_lifetime,
)
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


OVER = "finished at 2026-01-01T12:00:00Z, ttlSecondsAfterFinished {} is over"


@pytest.mark.parametrize(
    ("finished", "ttl", "now", "expected"),
    [
        (T0, None, T0 + timedelta(days=1), Due(now=False)),
        (None, 60, T0, Due(now=False, stamp_first=True)),
        (T0, 60, T0, Due(now=False, wait_seconds=60.0)),
        (T0, 60, T0 + timedelta(seconds=59.5), Due(now=False, wait_seconds=0.5)),
        (T0, 60, T0 + timedelta(seconds=60), Due(now=True, message=OVER.format(60))),
        (T0, 0, T0, Due(now=True, message=OVER.format(0))),
    ],
    ids=[
        "no_ttl_never",
        "no_finished_at_stamps_first",
        "waits_the_ttl",
        "waits_fractions",
        "at_the_second",
        "zero_is_now",
    ],
)
def test_after_finish(
    finished: datetime | None, ttl: int | None, now: datetime, expected: Due
) -> None:
    assert after_finish(finished, ttl, now) == expected


DELETE = Ending(delete_at_deadline=True)


@pytest.mark.parametrize(
    ("phase", "ending", "finished", "now", "expected"),
    [
        ("Running", DELETE, None, T0, LifetimeDecision(False, 10.0)),
        (
            "Running",
            DELETE,
            None,
            T0 + timedelta(seconds=10),
            LifetimeDecision(False, None, "lifetime ended at 2026-01-01T12:00:10Z", delete=True),
        ),
        ("Stopped", DELETE, T0, T0 + timedelta(hours=1), LifetimeDecision(expire=False)),
        (
            "Stopped",
            Ending(ttl_seconds=30),
            None,
            T0,
            LifetimeDecision(expire=False, stamp_finished=True),
        ),
        (
            "Failed",
            Ending(ttl_seconds=30),
            T0,
            T0 + timedelta(seconds=12),
            LifetimeDecision(False, 18.0),
        ),
        (
            "Dead",
            Ending(ttl_seconds=30),
            T0,
            T0 + timedelta(seconds=30),
            LifetimeDecision(
                False,
                None,
                "finished at 2026-01-01T12:00:00Z, ttlSecondsAfterFinished 30 is over",
                delete=True,
            ),
        ),
        (
            "Failed",
            Ending(ttl_seconds=30, kept_by_pool=True),
            T0,
            T0 + timedelta(hours=1),
            LifetimeDecision(expire=False),
        ),
        (
            "Running",
            Ending(ttl_seconds=0),
            None,
            T0 + timedelta(hours=1),
            LifetimeDecision(False, None),
        ),
    ],
    ids=[
        "delete_policy_waits_for_the_deadline",
        "delete_policy_deletes_at_the_deadline",
        "delete_policy_leaves_a_finished_one_without_ttl",
        "ttl_without_finished_at_stamps_it_first",
        "ttl_waits_the_rest_after_finished_at",
        "ttl_over_deletes",
        "failure_the_pool_counts_is_kept",
        "ttl_does_not_touch_a_live_sandbox",
    ],
)
def test_decide_lifetime_policy_and_ttl(
    phase: str, ending: Ending, finished: datetime | None, now: datetime, expected: LifetimeDecision
) -> None:
    deadline = T0 + timedelta(seconds=10) if ending.delete_at_deadline else None
    assert decide_lifetime(phase, deadline, now, ending, finished) == expected


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

    def run(self) -> list[str]:
        """Run what is due, then deliver every sandbox's event; the keys taken."""
        taken = asyncio.run(self.controller.queue.run_until_idle())
        for body in self.objects.sandboxes.values():
            self.cache.on_event("MODIFIED", copy.deepcopy(body))
        return taken

    def status(self, key: str) -> dict[str, object]:
        return dict(self.objects.sandboxes[key]["status"])


def test_sandbox_ends_stopped_at_its_shutdown_time_to_the_second() -> None:
    w = World()
    key = w.sandbox("job", shutdownTime=rfc3339(T0 + timedelta(seconds=30)))
    w.run()
    assert w.status(key)["phase"] == "Running"
    assert w.controller.queue.due_at(key) == w.clock.monotonic() + 30

    w.clock.advance(29.999)
    assert w.run() == [], "not a moment early: nothing was due"
    assert w.status(key)["phase"] == "Running"
    w.clock.advance(0.001)
    assert w.run() == [key]
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
    assert key in w.run(), "the standby never looked at the sandbox past its deadline"
    assert w.status(key)["phase"] == "Running"
    assert not w.objects.writes

    w.leader = True
    w.objects.sandboxes[key]["status"] = {"phase": "Stopped", "reason": "Exited"}
    w.objects.touch(w.objects.sandboxes[key])
    w.run()
    w.controller.enqueue_all()
    assert w.run() == [], "an ended sandbox without a TTL is still watched"
    w.controller.queue.add(key)  # a deadline set while it ran comes due all the same
    assert w.run() == [key]
    assert w.status(key)["reason"] == "Exited"


def test_delete_policy_deletes_the_sandbox_at_its_shutdown_time() -> None:
    w = World()
    key = w.sandbox(
        "job", shutdownTime=rfc3339(T0 + timedelta(seconds=20)), shutdownPolicy="Delete"
    )
    w.run()
    assert w.controller.queue.due_at(key) == w.clock.monotonic() + 20
    w.clock.advance(20)
    w.run()
    assert key not in w.objects.sandboxes
    assert w.cache.get(key) is None
    assert w.controller.deleted == 1 and w.controller.expired == 0


def test_a_finished_sandbox_is_stamped_then_deleted_at_finished_at_plus_ttl() -> None:
    w = World()
    key = w.sandbox("done", phase="Stopped", ttlSecondsAfterFinished=45)
    w.run()
    assert w.status(key)["finishedAt"] == rfc3339(T0), "finishedAt written first"
    w.run()
    assert w.controller.queue.due_at(key) == w.clock.monotonic() + 45
    w.clock.advance(44.999)
    assert w.run() == [], "not a moment early: nothing was due"
    assert key in w.objects.sandboxes
    w.clock.advance(0.001)
    assert w.run() == [key]
    assert key not in w.objects.sandboxes


def test_retain_at_the_deadline_then_the_ttl_collects_it() -> None:
    w = World()
    key = w.sandbox("job", activeDeadlineSeconds=5, ttlSecondsAfterFinished=10)
    w.clock.advance(5)
    w.run()
    assert (w.status(key)["phase"], w.status(key)["reason"]) == ("Stopped", "DeadlineExceeded")
    w.clock.advance(10)
    w.run()
    assert key not in w.objects.sandboxes
