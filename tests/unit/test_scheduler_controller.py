"""The scheduler's reconcile over a fake API and a fake clock: binds, waits, retries."""

from __future__ import annotations

from sandlot.controllers.scheduler import RETRY_AFTER_ERROR, RETRY_FORK
from tests.support.workloads import WorkloadWorld


def test_a_pending_sandbox_is_bound_and_marked_scheduled() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=2)
    key = w.sandbox("s1")
    w.step()
    assert w.bound(key) == "a"
    assert w.objects.phase(key) == "Scheduled"
    scheduled = w.condition(key, "Scheduled")
    assert scheduled is not None
    assert (scheduled["status"], scheduled["reason"]) == ("True", "Bound")
    assert w.cache.node_load["a"] == 1


def test_capacity_is_respected_and_a_waiting_sandbox_is_bound_when_room_appears() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=1)
    first, second = w.sandbox("s1"), w.sandbox("s2")
    assert second in w.step().sandboxes, "the sandbox left waiting was never judged"
    assert (w.bound(first), w.bound(second)) == ("a", None)
    waiting = w.condition(second, "Scheduled")
    assert waiting is not None
    assert (waiting["status"], waiting["reason"]) == ("False", "Unschedulable")
    assert w.scheduler.waiting.keys() == {second}
    assert w.scheduler.queue.due_at(second) is None, "no retry timer while nothing changes"

    w.clock.advance(30)
    w.capacity("a", 2)
    w.step()
    assert w.bound(second) == "a"
    bound = w.condition(second, "Scheduled")
    assert bound is not None
    assert bound["status"] == "True"
    assert bound["lastTransitionTime"] != waiting["lastTransitionTime"], "status changed"
    assert not w.scheduler.waiting


def test_a_new_reason_for_still_waiting_keeps_the_transition_time() -> None:
    w = WorkloadWorld()
    key = w.sandbox("s1")
    w.step()  # no nodes at all
    before = w.condition(key, "Scheduled")
    assert before is not None
    w.clock.advance(30)
    w.node("a", capacity=0)  # a node, but full: another message, same status
    w.step()
    after = w.condition(key, "Scheduled")
    assert after is not None
    assert after["message"] != before["message"]
    assert after["lastTransitionTime"] == before["lastTransitionTime"]


def test_an_api_error_is_retried_with_backoff_then_binds() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=1)
    key = w.sandbox("s1")
    w.objects.failing[key] = 500
    assert key in w.step().sandboxes, "the failing bind was never tried"
    assert w.bound(key) is None
    assert w.scheduler.queue.due_at(key) == w.clock.monotonic() + RETRY_AFTER_ERROR
    del w.objects.failing[key]
    w.clock.advance(RETRY_AFTER_ERROR)
    w.step()
    assert w.bound(key) == "a"
    assert w.scheduler.queue.failures(key) == 0


def test_a_standby_binds_nothing() -> None:
    w = WorkloadWorld()
    w.leader = False
    w.node("a", capacity=1)
    key = w.sandbox("s1")
    assert key in w.step().sandboxes, "never looked at: the standby's restraint is unproven"
    assert w.bound(key) is None
    assert w.objects.writes == []


def test_a_new_leader_judges_sandboxes_it_saw_as_a_standby_bound_ones_included() -> None:
    # The sandbox feed lists every sandbox as soon as a replica starts, usually before
    # it leads; a standby's queue drops them, so taking the lead must add them all.
    w = WorkloadWorld()
    w.leader = False
    w.node("a", capacity=2)
    free = w.sandbox("free")
    body = w.objects.add_sandbox("ns", "prebound", w.clock.now(), node="ghost")
    w.cache.on_event("SYNC", body)
    assert {free, "ns/prebound"} <= set(w.step().sandboxes), "the standby looked at neither"
    assert w.objects.writes == [], "a standby wrote"

    w.leader = True
    w.scheduler.enqueue_all()
    w.step()
    assert w.bound(free) == "a"
    waiting = w.condition("ns/prebound", "Scheduled")
    assert waiting is not None, "the sandbox bound to a missing node was never judged"
    assert (waiting["status"], waiting["reason"]) == ("False", "NodeNotFound")


def test_a_fork_waits_for_its_snapshot_then_goes_to_its_node() -> None:
    w = WorkloadWorld()
    w.node("a", capacity=5)
    w.node("b", capacity=5)
    for i in range(3):  # b is the busier node: the spread alone would pick a
        busy = w.objects.add_sandbox("ns", f"busy-{i}", w.clock.now(), node="b", phase="Running")
        w.cache.on_event(None, busy)
    snapshot = {
        "metadata": {"name": "prepared", "namespace": "ns"},
        "spec": {"sandboxName": "src", "nodeName": "b"},
        "status": {"phase": "Taking"},
    }
    w.objects.snapshots["ns/prepared"] = snapshot
    body = w.objects.add_sandbox("ns", "fork", w.clock.now())
    body["spec"]["snapshotRef"] = {"name": "prepared"}
    w.objects.sandboxes["ns/fork"]["spec"]["snapshotRef"] = {"name": "prepared"}
    w.cache.on_event(None, body)
    w.step()
    assert w.bound("ns/fork") is None
    waiting = w.condition("ns/fork", "Scheduled")
    assert waiting is not None
    assert (waiting["status"], waiting["reason"]) == ("False", "SnapshotNotReady")
    assert "snapshot prepared is Taking, not Ready" in waiting["message"]
    assert w.scheduler.queue.due_at("ns/fork") == w.clock.monotonic() + RETRY_FORK

    snapshot["status"] = {"phase": "Ready", "imageRef": "sandlot.local/snapshots/u:latest"}
    w.clock.advance(RETRY_FORK)
    w.step()
    assert w.bound("ns/fork") == "b"
