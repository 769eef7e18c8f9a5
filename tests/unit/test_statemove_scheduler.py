"""The scheduler moves a pushed suspended sandbox off a lost node only when node
health would mark it Dead (SPEC sections 2-3, 8): not within the node's grace, not
while the mass-failure guard holds, once its latch says handled; off a cordoned
node at once. Over a fake API and a fake clock, fed the node events node health's
status writes send."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta

from sandlot.api.timestamps import rfc3339
from tests.support.workloads import LEASE, WorkloadWorld

GRACE = timedelta(seconds=300)

SUSPENDED_PUSHED = {
    "phase": "Running",
    "conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended"}],
    "suspendedState": {"image": "r/s:u@sha256:0", "digest": "sha256:0", "node": "a"},
}


def lost_world() -> tuple[WorkloadWorld, str]:
    """Nodes a and b Ready; a pushed suspended sandbox on a; then a stops renewing
    and its lease runs out: NotReady, as the scheduler's liveness sees it."""
    w = WorkloadWorld()
    w.node("a", capacity=5)
    w.node("b", capacity=5)
    body = w.objects.add_sandbox("ns", "sb", w.clock.now(), node="a", phase="Running")
    body["status"] = dict(SUSPENDED_PUSHED)
    w.objects.sandboxes["ns/sb"]["status"] = dict(SUSPENDED_PUSHED)
    w.cache.on_event(None, body)
    w.step()
    assert w.bound("ns/sb") == "a", "moved off a Ready node"
    w.clock.advance(LEASE + 1)  # b renews, a does not
    w.renew("b")
    return w, "ns/sb"


def node_health(w: WorkloadWorld, name: str, **health: datetime | None) -> None:
    """Node health writes node ``name``'s status: NotReady, and ``health``."""
    body = w.objects.nodes[name]
    body["status"]["phase"] = "NotReady"
    body["status"]["health"] = {k: rfc3339(v) if v is not None else None for k, v in health.items()}
    w.objects.touch(body)
    w.scheduler.on_node("MODIFIED", copy.deepcopy(body))


def test_a_lost_nodes_pushed_sandbox_stays_within_grace_and_moves_once_handled() -> None:
    w, key = lost_world()
    expired = w.clock.now() - timedelta(seconds=1)
    node_health(w, "a", unhealthySince=expired)  # tracking starts: within grace
    taken = w.step()
    assert key in taken.sandboxes, "the scheduler never looked at the sandbox"
    assert w.bound(key) == "a", "moved off a NotReady node within its grace period"

    w.clock.advance(GRACE.total_seconds())
    w.renew("b")
    node_health(w, "a", unhealthySince=expired)  # grace over, the guard holds: no latch
    w.scheduler.enqueue_all()  # judged again, as a new leader would
    taken = w.step()
    assert key in taken.sandboxes, "the scheduler never looked at the sandbox"
    assert w.bound(key) == "a", "moved while the mass-failure guard held the node"

    node_health(w, "a", unhealthySince=expired, handledAt=w.clock.now())  # latched
    w.step()
    assert w.bound(key) == "b", "not moved once node health handled its node"


def test_a_cordoned_nodes_pushed_sandbox_moves_at_once() -> None:
    w, key = lost_world()
    w.renew("a")  # alive, but drained
    body = w.objects.nodes["a"]
    body["spec"]["unschedulable"] = True
    w.objects.touch(body)
    w.scheduler.on_node("MODIFIED", copy.deepcopy(body))
    w.step()
    assert w.bound(key) == "b"
