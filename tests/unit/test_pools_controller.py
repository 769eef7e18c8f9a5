"""The pool controller's reconcile, with the scheduler, over a fake API and a fake clock."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from sandlot.api.timestamps import parse_time, rfc3339
from sandlot.controllers.pools import RETRY_AFTER_ERROR
from tests.support.workloads import LEASE, WorkloadWorld


def test_a_pool_gets_its_replicas_owned_and_labelled_and_its_status() -> None:
    w = WorkloadWorld()
    pool = w.pool("web", replicas=3)
    w.step()
    members = w.members(pool)
    assert len(members) == 3
    for key in members:
        meta = w.objects.sandboxes[key]["metadata"]
        assert meta["ownerReferences"][0]["uid"] == "pool-uid-web"
    status = w.objects.pools[pool]["status"]
    assert (status["replicas"], status["pending"], status["observedGeneration"]) == (3, 3, 1)


def test_members_are_bound_within_capacity_and_spread_over_nodes() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=2)
    w.node("b", capacity=2)
    pool = w.pool("web", replicas=5)
    w.step()
    nodes = Counter(w.bound(k) for k in w.members(pool))
    assert nodes == {"a": 2, "b": 2, None: 1}, "capacity holds; one member waits for room"
    assert w.objects.pools[pool]["status"]["pending"] == 5


def test_a_dead_member_is_replaced_and_kept_as_history() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=2)
    w.node("b", capacity=2)
    pool = w.pool("web", replicas=2)
    w.step()
    first = w.members(pool)
    victim = next(k for k in first if w.bound(k) == "a")
    w.end(victim, "Dead")
    w.step()
    after = w.members(pool)
    assert victim in after, "the Dead member stays within the history limit"
    replacements = [k for k in after if k not in first]
    assert len(replacements) == 1
    assert w.bound(replacements[0]) in ("a", "b")
    assert w.objects.pools[pool]["status"]["dead"] == 1


def test_surplus_members_are_deleted_on_scale_down() -> None:
    w = WorkloadWorld()
    pool = w.pool("web", replicas=3)
    w.step()
    w.scale(pool, 1)
    w.step()
    assert len(w.members(pool)) == 1
    assert w.objects.pools[pool]["status"]["observedGeneration"] == 2


def test_failed_creates_are_retried_after_their_backoff() -> None:
    w = WorkloadWorld()
    pool = w.pool("web", replicas=2)
    w.objects.before_write = lambda verb, _key: _refuse(verb)
    w.step()
    assert w.members(pool) == []
    assert w.pools.queue.due_at(pool) == w.clock.monotonic() + RETRY_AFTER_ERROR
    w.objects.before_write = None
    w.clock.advance(RETRY_AFTER_ERROR)
    w.step()
    assert len(w.members(pool)) == 2


def test_a_standby_creates_nothing() -> None:
    w = WorkloadWorld()
    w.leader = False
    pool = w.pool("web", replicas=2)
    w.step()
    assert w.members(pool) == []
    assert w.objects.writes == []


def _refuse(verb: str) -> None:
    if verb == "create":
        raise RuntimeError("injected create failure")


def _run_bound_members(w: WorkloadWorld, pool: str) -> None:
    """Agents start what was bound: Scheduled members become Running."""
    for key in w.members(pool):
        body = w.objects.sandboxes[key]
        if body["status"].get("phase") == "Scheduled":
            body["status"]["phase"] = "Running"
            w.objects.touch(body)


def _change_template(w: WorkloadWorld, pool: str, image: str) -> None:
    body = w.objects.pools[pool]
    body["spec"]["template"]["spec"]["image"] = image
    body["metadata"]["generation"] += 1
    w.objects.touch(body)
    w.pools.on_pool("MODIFIED", copy.deepcopy(body))


def test_a_template_change_rolls_the_members_within_surge_and_unavailable() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=10)
    pool = w.pool("web", replicas=4)
    w.step()
    _run_bound_members(w, pool)
    w.step()
    assert w.objects.pools[pool]["status"]["updatedReplicas"] == 4

    _change_template(w, pool, "registry.example/app:2")
    seen_live, seen_running = [], []
    for _ in range(15):
        w.step()
        live = [
            k for k in w.members(pool) if w.objects.phase(k) not in ("Dead", "Stopped", "Failed")
        ]
        seen_live.append(len(live))
        seen_running.append(sum(1 for k in live if w.objects.phase(k) == "Running"))
        _run_bound_members(w, pool)
    w.step()
    status = w.objects.pools[pool]["status"]
    assert (status["updatedReplicas"], status["readyReplicas"], status["running"]) == (4, 4, 4)
    images = {w.objects.sandboxes[k]["spec"]["image"] for k in w.members(pool)}
    assert images == {"registry.example/app:2"}
    assert max(seen_live) <= 5, f"above replicas + maxSurge: {seen_live}"
    assert min(seen_running) >= 3, f"below replicas - maxUnavailable: {seen_running}"


def test_members_that_keep_failing_back_off_with_an_event_and_a_status() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=10)
    pool = w.pool("web", replicas=1)
    w.step()
    first = w.members(pool)[0]
    w.end(first, "Failed")
    w.step()
    status = w.objects.pools[pool]["status"]
    assert status["failedInARow"] == 1 and status["backoffUntil"]
    assert len(w.members(pool)) == 1, "no replacement during the back-off"
    assert ("web", "BackOff") in w.events
    due = w.pools.queue.due_at(pool)
    assert due is not None and due == w.clock.monotonic() + 10

    w.clock.advance(10)
    w.step()
    assert len(w.members(pool)) == 2, "replaced once the back-off is over"
    second = next(k for k in w.members(pool) if k != first)
    w.end(second, "Failed")
    w.step()
    status = w.objects.pools[pool]["status"]
    assert status["failedInARow"] == 2
    assert w.pools.queue.due_at(pool) == w.clock.monotonic() + 20, "the wait doubles"
    assert [r for _, r in w.events].count("BackOff") == 2


def _started(status: dict[str, Any]) -> datetime:
    started = parse_time(status["startedAt"])
    assert started is not None, f"a Running member without startedAt: {status}"
    return started


def _start_members(w: WorkloadWorld, pool: str, *, crash_after: float | None) -> None:
    """Agents start what was bound (startedAt: now); with ``crash_after``, a member of
    the new template exits 1 that many seconds after it started."""
    for key in w.members(pool):
        status = w.objects.sandboxes[key]["status"]
        if status.get("phase") == "Scheduled":
            status.update(phase="Running", startedAt=rfc3339(w.clock.now()))
            w.objects.touch(w.objects.sandboxes[key])
        elif (
            crash_after is not None
            and status.get("phase") == "Running"
            and w.objects.sandboxes[key]["spec"]["image"].endswith(":crashes")
            and w.clock.now() - _started(status) >= timedelta(seconds=crash_after)
        ):
            status.update(
                phase="Stopped", reason="Exited", exitCode=1, finishedAt=rfc3339(w.clock.now())
            )
            w.objects.touch(w.objects.sandboxes[key])


def test_members_that_crash_soon_after_starting_never_count_as_available() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=12)
    pool = w.pool(
        "web",
        replicas=4,
        minReadySeconds=10,
        strategy={"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}},
    )
    w.step()
    _start_members(w, pool, crash_after=None)
    w.step()  # the operator sees them Ready now
    w.clock.advance(11)
    w.renew("a")
    w.step()
    old = set(w.members(pool))

    _change_template(w, pool, "registry.example/app:crashes")
    running_seen = []
    for _ in range(120):  # 30 s in quarter-seconds
        w.step()
        _start_members(w, pool, crash_after=3)
        w.step()
        running_seen.append(sum(1 for k in w.members(pool) if w.objects.phase(k) == "Running"))
        w.clock.advance(0.25)
        w.renew("a")
    crashed = [k for k in w.members(pool) if w.objects.phase(k) == "Stopped"]
    assert crashed, "no new member ever ran and crashed: the rollout did not run"
    assert min(running_seen) >= 3, f"Running fell below replicas - maxUnavailable: {running_seen}"
    assert len({k for k in old if w.objects.phase(k) == "Running"}) >= 3


def test_a_member_becomes_available_at_min_ready_and_the_pool_looks_again_then() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=12)
    pool = w.pool("web", replicas=2, minReadySeconds=10)
    w.step()
    _start_members(w, pool, crash_after=None)
    w.step()  # the operator sees them Ready now: minReadySeconds counts from here
    w.clock.advance(4)
    w.step()
    due = w.pools.queue.due_at(pool)
    assert due == w.clock.monotonic() + 6, "the pool looks again when its members count"


def test_a_member_on_a_node_that_is_not_ready_is_not_available() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=12)
    pool = w.pool(
        "web", replicas=2, strategy={"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    )
    w.step()
    _start_members(w, pool, crash_after=None)
    w.step()
    w.clock.advance(LEASE + 1)  # the node's lease runs out: NotReady
    _change_template(w, pool, "registry.example/app:2")
    w.step()
    # Neither old member counts: each may go (it serves nobody), none is kept for the floor.
    assert not any(w.objects.phase(k) == "Running" for k in w.members(pool)), (
        "old members on a NotReady node were kept as if they served"
    )


def test_a_pool_over_the_operators_limit_keeps_that_many_and_says_so_once() -> None:
    w = WorkloadWorld()
    w.pools.max_replicas = 3
    pool = w.pool("big", replicas=10)
    w.step()
    assert len(w.members(pool)) == 3
    status = w.objects.pools[pool]["status"]
    assert (status["replicas"], status["cappedAt"]) == (10, 3)
    assert w.events.count(("big", "ReplicasCapped")) == 1
    w.pools.enqueue_all()
    w.step()
    assert w.events.count(("big", "ReplicasCapped")) == 1, "said again while nothing changed"
    assert len(w.members(pool)) == 3

    w.pools.max_replicas = 20  # the operator's limit raised: the pool gets what it asks
    w.pools.enqueue_all()
    w.step()
    assert len(w.members(pool)) == 10
    assert w.objects.pools[pool]["status"].get("cappedAt") is None


def test_a_pass_judges_each_node_once_however_many_members_it_holds() -> None:
    """A pass runs on every member event, so over a large pool its cost per member is
    what a burst of claims pays: a node's readiness is judged once a pass, not once a
    member."""
    w = WorkloadWorld()
    w.node("a", capacity=12)
    w.node("b", capacity=12)
    pool = w.pool("web", replicas=20)
    w.step()
    _start_members(w, pool, crash_after=None)
    w.step()
    judged: list[str] = []
    ready = w.pools.node_ready

    def judging(name: str) -> bool:
        judged.append(name)
        return ready(name)

    w.pools.node_ready = judging
    asyncio.run(w.pools.reconcile(pool))  # one pass
    assert sorted(judged) == ["a", "b"], f"one pass over 20 members judged {judged}"
