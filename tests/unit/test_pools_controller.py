"""The pool controller's reconcile, with the scheduler, over a fake API and a fake clock."""

from __future__ import annotations

from collections import Counter

from sandlot.controllers.pools import RETRY_AFTER_ERROR
from tests.support.workloads import WorkloadWorld


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
