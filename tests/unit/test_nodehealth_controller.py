"""The node-health reconcile over a fake Objects and a fake clock: what it writes, when."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandlot.adapters.objects import LeaseRecord
from sandlot.api.timestamps import parse_time
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.nodehealth import RETRY_AFTER_FAILURE, NodeHealthController
from sandlot.controllers.settings import OperatorSettings
from sandlot.policy.nodehealth import NodeHealthSettings
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

GRACE = 300.0
LEASE = 10


class World:
    """One controller, its fake API and clock, and what it posted."""

    def __init__(self, nodes: int = 1) -> None:
        self.clock = FakeClock()
        self.objects = FakeObjects(self.clock.now)
        self.leader = True
        self.events: list[tuple[str, str]] = []  # (node, reason)
        self.delivered: dict[str, str] = {}  # node -> resourceVersion last delivered
        self.silent = False  # the lease watch died silently: nothing is heard
        self.registry = CollectorRegistry()
        self.ctl = NodeHealthController(
            OperatorSettings(
                node_health=NodeHealthSettings(grace_period=timedelta(seconds=GRACE)),
                leader_election=False,
            ),
            self.objects,  # type: ignore[arg-type]
            OperatorMetrics(self.registry),
            is_leader=lambda: self.leader,
            post_event=self.post,
            clock=self.clock.now,
            queue_clock=self.clock.monotonic,
        )
        self.created = self.clock.now() - timedelta(hours=1)
        for i in range(1, nodes + 1):
            self.ctl.on_node(None, self.objects.add_node(f"n{i}", self.created))
            self.renew(f"n{i}")
        self.ctl.on_view_restored()

    def post(self, body: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((body["metadata"]["name"], reason))

    def renew(self, node: str, at: datetime | None = None) -> None:
        record = LeaseRecord(
            name=node,
            holder=node,
            renew_time=at or self.clock.now(),
            duration_seconds=LEASE,
            resource_version="1",
        )
        self.ctl.on_lease("MODIFIED", record)

    def sandboxes(self, node: str, n: int) -> list[str]:
        keys = []
        for i in range(n):
            self.objects.add_sandbox(
                "ns", f"{node}-sb{i}", self.created, node=node, phase="Running"
            )
            keys.append(f"ns/{node}-sb{i}")
        return keys

    def step(self) -> list[str]:
        """Run what is due, then deliver the watch event of every node that changed.

        The lease watch is alive throughout (it is heard at every step), unless a test
        says otherwise with ``silent``."""
        if not self.silent:
            self.ctl.on_heard()
        done = asyncio.run(self.ctl.queue.run_until_idle())
        for name, body in self.objects.nodes.items():
            rv = body["metadata"]["resourceVersion"]
            if self.delivered.get(name) != rv:
                self.delivered[name] = rv
                self.ctl.on_node("MODIFIED", dict(body))
        return done

    def health(self, node: str) -> dict[str, Any]:
        return dict(self.objects.nodes[node]["status"].get("health") or {})

    def due_in(self, node: str) -> float | None:
        due = self.ctl.queue.due_at(node)
        return None if due is None else due - self.ctl.queue.clock()


def lost(world: World, node: str = "n1") -> None:
    """The node's agent stops renewing: its lease expires LEASE seconds from now."""
    world.renew(node)
    world.step()
    world.clock.advance(LEASE)
    world.step()  # the wake-up at the lease's expiry: tracking starts
    assert world.health(node).get("unhealthySince"), "tracking did not start at the expiry"


def test_a_ready_node_is_due_again_at_its_lease_expiry_exactly() -> None:
    w = World()
    w.renew("n1")
    w.step()
    assert w.due_in("n1") == LEASE
    assert w.objects.nodes["n1"]["status"]["phase"] == "Ready"


def test_grace_expiry_marks_at_the_exact_deadline_and_not_a_tick_before() -> None:
    w = World()
    keys = w.sandboxes("n1", 2)
    lost(w)
    assert w.due_in("n1") == GRACE, "the reconcile asks for the grace end, to the second"
    w.clock.advance(GRACE - 0.5)
    w.ctl.enqueue("n1")  # kopf's resync timer ticks just before the deadline
    assert w.step() == ["n1"], "the early pass never ran"
    assert [w.objects.phase(k) for k in keys] == ["Running", "Running"]
    assert w.due_in("n1") == 0.5
    w.clock.advance(0.5)
    w.step()
    assert [w.objects.phase(k) for k in keys] == ["Dead", "Dead"]
    assert w.health("n1")["handledCount"] == 2
    assert ("n1", "GraceExpired") in w.events
    writes = len(w.objects.writes)
    w.clock.advance(60)
    w.ctl.enqueue_all()
    assert "n1" in w.step(), "the handled node's pass never ran"
    assert len(w.objects.writes) == writes, "a handled node costs no write"


def test_a_partial_marking_leaves_the_latch_unset_and_is_retried_after_its_backoff() -> None:
    w = World()
    good, bad = w.sandboxes("n1", 2)
    w.objects.failing[bad] = 500
    lost(w)
    w.clock.advance(GRACE)
    w.step()
    assert (w.objects.phase(good), w.objects.phase(bad)) == ("Dead", "Running")
    assert "handledAt" not in w.health("n1")
    assert ("n1", "MarkingFailed") in w.events
    assert w.due_in("n1") == RETRY_AFTER_FAILURE
    w.ctl.queue.add_after("n1", GRACE)  # a later deadline does not push the retry back
    assert w.due_in("n1") == RETRY_AFTER_FAILURE
    del w.objects.failing[bad]
    w.clock.advance(RETRY_AFTER_FAILURE - 0.5)
    w.step()
    assert w.objects.phase(bad) == "Running"
    w.clock.advance(0.5)
    w.step()
    assert w.objects.phase(bad) == "Dead"
    assert w.health("n1")["handledAt"]


@pytest.mark.parametrize(
    ("lose_on", "sandboxes_marked"),
    [("list", 0), ("first-mark", 3)],
    ids=["lost_while_listing_marks_nothing", "lost_while_marking_writes_no_node_status"],
)
def test_leadership_lost_in_the_middle_of_a_pass_stops_writing(
    lose_on: str, sandboxes_marked: int
) -> None:
    w = World()
    keys = w.sandboxes("n1", 3)
    lost(w)
    w.clock.advance(GRACE)
    writes_before = len(w.objects.writes)
    events_before = len(w.events)

    def lose(*_: object) -> None:
        w.leader = False

    if lose_on == "list":
        w.objects.on_list = lose
    else:
        w.objects.before_write = lose
    assert w.step() == ["n1"], "the pass under test never ran"
    marked = [k for k in keys if w.objects.phase(k) == "Dead"]
    assert len(marked) == sandboxes_marked
    after = w.objects.writes[writes_before:]
    assert [v for v, _ in after if v == "patch-node-status"] == [], "wrote node status"
    assert "handledAt" not in w.health("n1")
    assert w.events[events_before:] == [("n1", "GraceExpired")], "an event after the loss"
    assert w.ctl.queue.due_at("n1") is None, "a standby leaves the retry to the new leader"


def test_the_mass_failure_guard_holds_then_lifts_and_the_held_nodes_are_reaped() -> None:
    w = World(nodes=4)
    keys = {n: w.sandboxes(n, 1)[0] for n in ("n1", "n2", "n3", "n4")}
    for n in ("n1", "n2", "n3", "n4"):
        w.renew(n)
    w.step()
    w.clock.advance(LEASE)
    w.renew("n4")
    w.step()  # n1..n3 NotReady: 3 of 4, over the threshold
    w.clock.advance(GRACE)
    w.renew("n4")
    w.ctl.enqueue_all()
    assert {"n1", "n2", "n3"} <= set(w.step()), "the held nodes' passes never ran"
    assert {n: w.objects.phase(k) for n, k in keys.items()} == dict.fromkeys(keys, "Running")
    held = [
        c["type"]
        for c in w.objects.nodes["n1"]["status"].get("conditions", [])
        if c["status"] == "True"
    ]
    assert "GuardHolding" in held
    assert ("n1", "MassFailureHold") in w.events
    w.step()
    assert len(w.ctl.queue) == 0, "nothing may be left queued before the guard lifts"

    w.clock.advance(2)  # past the fleet summary's reuse
    w.renew("n2")
    w.renew("n3")  # two come back: 1 of 4 NotReady, the guard lifts
    w.step()
    assert w.objects.phase(keys["n1"]) == "Dead", "the held node was not re-enqueued"
    assert [w.objects.phase(keys[n]) for n in ("n2", "n3", "n4")] == ["Running"] * 3
    conditions = w.objects.nodes["n1"]["status"].get("conditions", [])
    assert "GuardHolding" not in [c["type"] for c in conditions]


def test_a_stale_watch_event_after_our_write_does_not_undo_it() -> None:
    w = World()
    w.sandboxes("n1", 1)
    lost(w)
    stale = {**w.objects.nodes["n1"], "status": {}}  # an event from before our write
    stale["metadata"] = {**stale["metadata"], "resourceVersion": "1"}
    w.clock.advance(GRACE)
    w.ctl.on_heard()
    w.ctl.queue.add("n1")
    asyncio.run(w.ctl.queue.run_until_idle())  # marks and latches; its echo is not here yet
    w.ctl.on_node("MODIFIED", stale)
    assert w.ctl.nodes["n1"]["status"]["health"]["handledAt"], "a stale event replaced ours"
    writes = len(w.objects.writes)
    asyncio.run(w.ctl.queue.run_until_idle())
    assert len(w.objects.writes) == writes, "the stale event led to a second marking"
    echo = dict(w.objects.nodes["n1"])
    w.ctl.on_node("MODIFIED", echo)
    assert w.ctl.nodes["n1"] == echo
    w.ctl.on_node(None, stale)  # a listing is always taken
    assert w.ctl.nodes["n1"] is stale


def test_the_ready_condition_keeps_its_time_when_only_the_reason_changes() -> None:
    w = World()
    lost(w)
    ready = next(c for c in w.objects.nodes["n1"]["status"]["conditions"] if c["type"] == "Ready")
    since = ready["lastTransitionTime"]
    assert ready["status"] == "False"
    w.clock.advance(30)
    w.objects.nodes["n1"]["spec"]["unschedulable"] = True  # sandlot drain
    w.objects.nodes["n1"]["metadata"]["resourceVersion"] = "drained"
    w.ctl.on_node("MODIFIED", dict(w.objects.nodes["n1"]))
    w.step()
    ready = next(c for c in w.objects.nodes["n1"]["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["lastTransitionTime"]) == ("Drained", since)


# -- liveness on the operator's own clock ---------------------------------------------


def renew_stamped(world: World, node: str, skew: timedelta) -> None:
    """The agent renews with a clock ``skew`` off the operator's."""
    world.renew(node, at=world.clock.now() + skew)


@pytest.mark.parametrize(
    "skew", [timedelta(minutes=-10), timedelta(minutes=-6)], ids=["10_min_slow", "6_min_slow"]
)
def test_an_agent_with_a_slow_clock_that_renews_stays_ready_past_grace(skew: timedelta) -> None:
    w = World()
    keys = w.sandboxes("n1", 2)
    for _ in range(int((GRACE + 2 * LEASE) / 5)):
        renew_stamped(w, "n1", skew)
        w.step()
        w.clock.advance(5)
    assert w.objects.nodes["n1"]["status"]["phase"] == "Ready"
    assert [w.objects.phase(k) for k in keys] == ["Running", "Running"]
    assert "unhealthySince" not in w.health("n1") or w.health("n1")["unhealthySince"] is None


def test_an_agent_with_a_fast_clock_that_stops_is_not_ready_a_lease_after_its_last_renewal() -> (
    None
):
    w = World()
    keys = w.sandboxes("n1", 1)
    renew_stamped(w, "n1", timedelta(minutes=10))
    w.step()
    stopped = w.clock.now()
    w.clock.advance(LEASE - 0.5)
    w.step()
    assert w.objects.nodes["n1"]["status"]["phase"] == "Ready"
    w.clock.advance(0.5)
    w.step()
    assert w.objects.nodes["n1"]["status"]["phase"] == "NotReady"
    assert parse_time(w.health("n1")["unhealthySince"]) == stopped + timedelta(seconds=LEASE)
    w.clock.advance(GRACE)
    w.step()
    assert w.objects.phase(keys[0]) == "Dead"


def test_a_deleted_lease_is_neither_a_renewal_nor_a_death() -> None:
    w = World()
    keys = w.sandboxes("n1", 1)
    w.renew("n1")
    w.step()
    w.ctl.on_lease("DELETED", LeaseRecord("n1", None, None, 0, ""))
    w.step()
    assert w.objects.nodes["n1"]["status"]["phase"] == "Ready"
    w.clock.advance(3)
    w.renew("n1")  # the agent recreates it: a renewal
    w.step()
    w.clock.advance(LEASE - 1)
    w.step()
    assert w.objects.nodes["n1"]["status"]["phase"] == "Ready", "the recreated Lease counts"
    assert w.objects.phase(keys[0]) == "Running"


def test_a_new_leader_finding_the_lease_unchanged_keeps_the_recorded_deadline() -> None:
    w = World()
    keys = w.sandboxes("n1", 1)
    last = w.clock.now()
    w.renew("n1", at=last)
    w.step()
    w.clock.advance(LEASE)
    w.step()
    since = w.health("n1")["unhealthySince"]
    assert w.health("n1")["lastRenewal"]["renewTime"] == last.isoformat()
    w.clock.advance(GRACE / 2)
    # A new leader: nothing in memory; the node's status and the unchanged Lease.
    new = World.__new__(World)
    new.__dict__.update(w.__dict__)
    new.ctl = NodeHealthController(
        OperatorSettings(
            node_health=NodeHealthSettings(grace_period=timedelta(seconds=GRACE)),
            leader_election=False,
        ),
        w.objects,  # type: ignore[arg-type]
        OperatorMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        post_event=w.post,
        clock=w.clock.now,
        queue_clock=w.clock.monotonic,
    )
    new.delivered = {}
    new.ctl.on_node(None, dict(w.objects.nodes["n1"]))
    new.renew("n1", at=last)  # the listing shows the same renewal
    new.ctl.on_view_restored()
    new.step()
    assert new.health("n1")["unhealthySince"] == since, "the episode started over"
    assert new.due_in("n1") == pytest.approx(GRACE / 2)
    new.clock.advance(GRACE / 2)
    new.step()
    assert new.objects.phase(keys[0]) == "Dead"


def test_a_silent_lease_watch_blocks_reaping_until_a_fresh_view_has_waited_a_lease() -> None:
    w = World()
    keys = w.sandboxes("n1", 1)
    lost(w)
    w.silent = True  # the watch died without a word
    w.clock.advance(GRACE)
    assert w.step() == ["n1"], "the pass at the grace's end never ran"
    assert w.objects.phase(keys[0]) == "Running", "reaped from a view nobody heard from"
    w.clock.advance(30)
    w.ctl.enqueue("n1")  # kopf's resync timer ticks on, the view still silent
    assert w.step() == ["n1"], "the pass on a silent view never ran"
    assert w.objects.phase(keys[0]) == "Running"
    # The watch is replaced: a fresh list re-establishes the view; agents get one lease.
    w.silent = False
    w.ctl.on_view_restored()
    assert w.step() == ["n1"], "the pass on the restored view never ran"
    assert w.objects.phase(keys[0]) == "Running"
    assert w.due_in("n1") == pytest.approx(LEASE)
    w.clock.advance(LEASE)
    w.step()
    assert w.objects.phase(keys[0]) == "Dead"


def counting_fleet_passes(w: World) -> list[int]:
    """Count the controller's summaries of the fleet (one liveness phase a node each)."""
    calls = [0]
    phase = w.ctl.liveness.phase

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return phase(*args, **kwargs)

    w.ctl.liveness.phase = counted  # type: ignore[method-assign]
    return calls


def test_routine_passes_share_one_summary_of_the_fleet_for_ten_seconds() -> None:
    w = World(nodes=20)
    calls = counting_fleet_passes(w)
    w.ctl.enqueue_all()
    w.step()
    assert calls[0] == 20, "twenty passes, one summary of twenty nodes"
    w.clock.advance(5)
    for i in range(1, 21):
        w.renew(f"n{i}")
    w.ctl.enqueue_all()
    w.step()
    assert calls[0] == 20, "a summary five seconds old serves passes that guard nothing"
    w.clock.advance(5)
    w.ctl.enqueue_all()
    w.step()
    assert calls[0] == 40, "at ten seconds it is summarized again"


def test_a_pass_the_guard_decides_judges_it_on_a_summary_at_most_a_second_old() -> None:
    # n1's grace ends at T. Five seconds before, a routine pass summarizes the fleet
    # with n1 alone NotReady; then seven more agents stop renewing (expired at T - 2).
    # The summary from T - 5 would let n1 be reaped; the fleet at T is 8 of 10
    # NotReady, so the guard holds.
    w = World(nodes=10)
    keys = w.sandboxes("n1", 2)
    others = [f"n{i}" for i in range(2, 11)]
    lost(w)  # n1's lease expired now; its deadline is GRACE from now
    deadline = w.clock.now() + timedelta(seconds=GRACE)
    while w.clock.now() < deadline - timedelta(seconds=12):
        w.clock.advance(4)
        for node in others:
            w.renew(node)
        w.step()
    w.clock.advance_to(deadline - timedelta(seconds=12))
    for node in others:
        w.renew(node)  # n2..n8 renew for the last time: expired at T - 2
    w.step()
    w.clock.advance_to(deadline - timedelta(seconds=5))
    for node in ("n9", "n10"):
        w.renew(node)
    calls = counting_fleet_passes(w)
    w.ctl.enqueue("n9")
    w.step()
    assert calls[0] == 10, "the routine pass at T - 5 summarized the fleet"
    w.clock.advance_to(deadline)
    assert "n1" in w.step(), "n1's pass at its deadline never ran"
    assert [w.objects.phase(k) for k in keys] == ["Running", "Running"]
    assert ("n1", "MassFailureHold") in w.events
    assert calls[0] == 20, "n1's pass summarized the fleet afresh at its deadline"


def test_a_failed_lease_watch_blocks_reaping_until_a_list_restores_the_view() -> None:
    w = World()
    keys = w.sandboxes("n1", 1)
    lost(w)
    w.clock.advance(GRACE - 1)
    w.step()
    w.ctl.on_view_lost()  # the watch fails a second before n1's deadline
    w.silent = True  # nothing is heard until the list that restores the view
    w.clock.advance(1)
    assert w.step() == ["n1"], "the pass at n1's deadline never ran"
    assert w.objects.phase(keys[0]) == "Running", "reaped on a view with a gap"
    w.clock.advance(5)
    w.ctl.on_view_restored()
    assert w.step() == ["n1"], "the pass on the restored view never ran"
    assert w.objects.phase(keys[0]) == "Running", "a restored view waits one lease duration"
    w.clock.advance(LEASE)
    w.step()
    assert w.objects.phase(keys[0]) == "Dead"


# -- a wall-clock step moves no verdict: liveness is timed on the monotonic clock --------

TEN_MINUTES = timedelta(minutes=10)


def phase_of(w: World, node: str = "n1") -> str:
    phase: str = w.objects.nodes[node]["status"]["phase"]
    return phase


@pytest.mark.parametrize("step", [TEN_MINUTES, -TEN_MINUTES], ids=["forward", "back"])
def test_a_node_that_renews_stays_ready_through_a_wall_clock_step(step: timedelta) -> None:
    w = World()
    keys = w.sandboxes("n1", 1)
    w.renew("n1")
    w.step()
    passes = len(w.objects.writes)
    w.clock.step_wall(step)
    for _ in range(int(2 * LEASE / 2)):
        w.ctl.enqueue("n1")  # kopf's resync timer
        assert w.step() == ["n1"], "the resync ran no pass"
        w.clock.advance(2)
        w.renew("n1")
    assert phase_of(w) == "Ready"
    assert w.objects.phase(keys[0]) == "Running"
    assert ("n1", "NodeNotReady") not in w.events
    assert len(w.objects.writes) == passes, "a step made the controller write status"


@pytest.mark.parametrize("step", [TEN_MINUTES, -TEN_MINUTES], ids=["forward", "back"])
def test_wall_clock_steps_move_neither_the_lease_expiry_nor_the_grace_deadline(
    step: timedelta,
) -> None:
    w = World()
    keys = w.sandboxes("n1", 1)
    w.renew("n1")
    w.step()
    w.clock.step_wall(step)  # within the last lease
    expired_on_wall = w.clock.now() + timedelta(seconds=LEASE)
    w.clock.advance(LEASE - 0.5)
    w.ctl.enqueue("n1")
    assert w.step() == ["n1"], "the pass before the lease ran out never ran"
    assert phase_of(w) == "Ready", "NotReady before its lease ran out"
    w.clock.advance(0.5)
    w.step()
    assert phase_of(w) == "NotReady", "still Ready after its lease ran out"
    # Status speaks the wall clock as it reads now, and keeps saying it after a step.
    assert parse_time(w.health("n1")["unhealthySince"]) == expired_on_wall
    w.clock.step_wall(step)  # within grace
    w.clock.advance(GRACE - 0.5)
    w.ctl.enqueue("n1")
    w.step()
    assert w.objects.phase(keys[0]) == "Running", "marked before the grace period ended"
    assert parse_time(w.health("n1")["unhealthySince"]) == expired_on_wall
    w.clock.advance(0.5)
    w.step()
    assert w.objects.phase(keys[0]) == "Dead", "not marked when the grace period ended"


def successor(w: World) -> World:
    """A new leader: nothing in memory, a monotonic clock of its own origin; the node's
    status and the unchanged Lease as its first listing shows them."""
    new = World.__new__(World)
    new.__dict__.update(w.__dict__)
    new.ctl = NodeHealthController(
        OperatorSettings(
            node_health=NodeHealthSettings(grace_period=timedelta(seconds=GRACE)),
            leader_election=False,
        ),
        w.objects,  # type: ignore[arg-type]
        OperatorMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        post_event=w.post,
        clock=w.clock.now,
        queue_clock=lambda: w.clock.monotonic() + 12345.0,
    )
    new.delivered = {}
    return new


@pytest.mark.parametrize(
    ("skew", "due"),
    [(-TEN_MINUTES, GRACE), (TEN_MINUTES, LEASE)],
    ids=[
        "behind_the_writer_restarts_grace_from_now_never_from_the_future",
        "ahead_of_the_writer_still_waits_one_lease_on_its_own_view",
    ],
)
def test_a_new_leader_reads_the_recorded_episode_on_its_own_wall_clock(
    skew: timedelta, due: float
) -> None:
    # The status carries wall-clock moments; a successor translates them with its own
    # wall clock, so one that disagrees with the writer's shifts them. Behind, the
    # recorded moments would lie in the future: they move back together until the
    # latest is now, the episode kept. Ahead, the grace looks over, but no leader reaps
    # before its own view of the Leases has waited one lease duration.
    w = World()
    keys = w.sandboxes("n1", 1)
    last = w.clock.now()
    w.renew("n1", at=last)
    lost(w)
    w.clock.advance(GRACE / 2)
    w.clock.step_wall(skew)
    new = successor(w)
    new.ctl.on_node(None, dict(w.objects.nodes["n1"]))
    new.renew("n1", at=last)  # the listing shows the same renewal
    new.ctl.on_view_restored()
    new.step()
    assert phase_of(new) == "NotReady"
    assert ("n1", "NodeRecovered") not in new.events, "the episode was dropped"
    assert new.due_in("n1") == pytest.approx(due)
    new.clock.advance(due - 0.5)
    new.step()
    assert new.objects.phase(keys[0]) == "Running"
    new.clock.advance(0.5)
    new.step()
    assert new.objects.phase(keys[0]) == "Dead"


def held_fleet() -> tuple[World, dict[str, str]]:
    """Four nodes, three lost for good: the guard holds them past their grace."""
    w = World(nodes=4)
    keys = {n: w.sandboxes(n, 1)[0] for n in ("n1", "n2", "n3", "n4")}
    w.step()
    w.clock.advance(LEASE)
    w.renew("n4")
    w.step()
    w.clock.advance(GRACE + 1)
    w.renew("n4")
    w.ctl.enqueue_all()
    assert {"n1", "n2", "n3"} <= set(w.step()), "the held nodes' passes never ran"
    assert {n: w.objects.phase(k) for n, k in keys.items()} == dict.fromkeys(keys, "Running")
    return w, keys


def test_a_lasting_hold_is_reported_again_and_its_length_gauged() -> None:
    w, _ = held_fleet()
    registry = w.registry
    held = registry.get_sample_value("sandlot_operator_guard_held_seconds")
    assert held == 1.0, "held one second past the grace period"
    first = w.events.count(("n1", "MassFailureHold"))
    assert first == 1, "the hold is said once when it begins"
    w.clock.advance(300)
    w.renew("n4")
    w.ctl.enqueue_all()
    w.step()
    assert w.events.count(("n1", "MassFailureHold")) == 1, "said again before report_every"
    assert registry.get_sample_value("sandlot_operator_guard_held_seconds") == 301.0
    due = w.due_in("n1")
    assert due is not None and due <= 600 - 301, "the next report is not waited for"
    w.clock.advance(due)
    w.renew("n4")
    w.step()
    assert w.events.count(("n1", "MassFailureHold")) == 2, "a lasting hold is said again"
    w.leader = False
    assert registry.get_sample_value("sandlot_operator_guard_held_seconds") == 0.0, (
        "a standby reports no hold: it decides nothing"
    )


def test_a_reap_decision_marks_only_its_node_while_the_guard_holds() -> None:
    w, keys = held_fleet()
    body = w.objects.nodes["n1"]
    since = body["status"]["health"]["unhealthySince"]
    body["spec"]["reap"] = {"unhealthySince": since, "requestedBy": "alice"}
    w.objects.touch(body)
    w.step()
    w.step()
    assert w.objects.phase(keys["n1"]) == "Dead"
    assert w.objects.sandboxes[keys["n1"]]["status"]["reason"] == "ManualReap"
    assert [w.objects.phase(keys[n]) for n in ("n2", "n3", "n4")] == ["Running"] * 3
    assert w.health("n1").get("handledAt"), "the reaped node is latched"
    assert ("n1", "ManualReap") in w.events
    conditions = w.objects.nodes["n1"]["status"].get("conditions", [])
    assert "GuardHolding" not in [c["type"] for c in conditions]


def test_a_reap_decision_for_an_earlier_episode_marks_nothing() -> None:
    w, keys = held_fleet()
    body = w.objects.nodes["n1"]
    body["spec"]["reap"] = {"unhealthySince": "2000-01-01T00:00:00Z"}
    w.objects.touch(body)
    w.step()
    w.step()
    assert w.objects.phase(keys["n1"]) == "Running"
    assert ("n1", "ManualReap") not in w.events


# -- a view restored by a list of several pages ------------------------------------------


def _outage(w: World) -> None:
    """The lease watch fails and nothing is heard for lease + grace + 30 s."""
    w.ctl.on_view_lost()
    w.silent = True
    w.clock.advance(LEASE + GRACE + 30)
    w.step()


def test_nodes_on_pages_not_yet_listed_are_not_reaped_while_the_first_pages_renew() -> None:
    """After a watch failure, a re-list delivers its first page (n1..n3, renewed during
    the outage) while n4's page is still on its way: n4 holds its renewal from before
    the outage, but nothing may be judged on a view still loading. 1 of 4 looks
    expired, under the guard's threshold, so only this rule keeps n4's sandbox."""
    w = World(nodes=4)
    keys = {n: w.sandboxes(n, 1)[0] for n in ("n1", "n2", "n3", "n4")}
    w.step()
    _outage(w)
    for n in ("n1", "n2", "n3"):  # the first page
        w.ctl.on_lease("SYNC", _record(n, w.clock.now()))
    for _ in range(int(GRACE) + 5):  # the last page takes its time; every node is looked at
        w.clock.advance(1)
        w.ctl.enqueue_all()
        w.step()
    assert w.objects.phase(keys["n4"]) == "Running", "a node on an unlisted page was reaped"
    w.ctl.on_lease("SYNC", _record("n4", w.clock.now()))  # the last page
    w.ctl.on_view_restored()
    w.silent = False
    for _ in range(3):
        w.clock.advance(LEASE / 2)
        for n in keys:
            w.renew(n)
        w.step()
    assert {n: w.objects.phase(k) for n, k in keys.items()} == dict.fromkeys(keys, "Running")


def test_after_a_relist_a_really_dead_node_is_reaped_a_lease_after_the_list_ended() -> None:
    w = World(nodes=4)
    keys = {n: w.sandboxes(n, 1)[0] for n in ("n1", "n2", "n3", "n4")}
    w.step()
    _outage(w)
    for n in ("n1", "n2", "n3"):
        w.ctl.on_lease("SYNC", _record(n, w.clock.now()))
    w.ctl.on_lease("SYNC", _record("n4", w.clock.now() - timedelta(seconds=LEASE + GRACE + 30)))
    w.ctl.on_view_restored()
    w.silent = False
    ended = w.clock.now()
    while w.objects.phase(keys["n4"]) == "Running" and w.clock.now() - ended < timedelta(
        seconds=LEASE + GRACE + 5
    ):
        w.clock.advance(1)
        for n in ("n1", "n2", "n3"):
            w.renew(n)
        w.step()
    assert w.objects.phase(keys["n4"]) == "Dead", "the dead node was never reaped"
    assert w.clock.now() - ended >= timedelta(seconds=LEASE), "reaped before the view settled"
    assert [w.objects.phase(keys[n]) for n in ("n1", "n2", "n3")] == ["Running"] * 3


def _record(node: str, at: datetime) -> LeaseRecord:
    return LeaseRecord(
        name=node, holder=node, renew_time=at, duration_seconds=LEASE, resource_version="2"
    )
