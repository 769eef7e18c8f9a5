"""Node health against the real API server: real ``sandlot operator`` processes,
node Leases renewed (or not) as agents renew them, a short grace (3 s) and lease
(2 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.objects import Objects
from sandlot.api.timestamps import parse_time, rfc3339
from sandlot.controllers.marking import Marker, NodeMarking
from sandlot.controllers.metrics import OperatorMetrics
from tests.support.operator import Fleet
from tests.support.passes import node_passes, wait_node_passes, wait_node_passes_after
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

FAST = ("--grace-period", "3s", "--resync-interval", "1s")


def marked_at(fleet: Fleet, name: str) -> datetime:
    finished = parse_time(fleet.get(name)["status"]["finishedAt"])
    assert finished is not None, name
    return finished


def test_lost_node_sandboxes_go_dead_after_grace_and_terminal_ones_stay(fleet, operators):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1)
    fleet.sandbox("run-a", n1, "Running", hostNetwork=True)
    fleet.sandbox("run-b", n1, "Running")
    fleet.sandbox("sched", n1, "Scheduled")
    fleet.sandbox("stopped", n1, None)
    fleet.set_phase("stopped", "Stopped", reason="Exited", exitCode=0)
    fleet.sandbox("failed", n1, None)
    fleet.set_phase("failed", "Failed", reason="ImageNotFound")
    operators(*FAST)
    wait_for(
        lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready while its lease is renewed",
    )

    last_renew = lease.pause()
    deadline = last_renew + timedelta(seconds=2 + 3)
    for name in ("run-a", "run-b", "sched"):
        wait_for(partial(lambda n: fleet.phase(n) == "Dead", name), timeout=20, what=f"{name} Dead")

    for name in ("run-a", "run-b", "sched"):
        sb = fleet.get(name)
        assert sb["status"]["reason"] == "NodeLost"
        assert marked_at(fleet, name) >= deadline - timedelta(milliseconds=50), (
            "marked before the grace period ended"
        )
    assert fleet.get("run-a")["spec"]["hostNetwork"] is True, "a Dead marking changed spec"
    assert fleet.get("stopped")["status"] == {"phase": "Stopped", "reason": "Exited", "exitCode": 0}
    assert fleet.get("failed")["status"]["reason"] == "ImageNotFound"

    # The latch is written after the last mark lands.
    wait_for(lambda: fleet.health(n1).get("handledAt"), timeout=10, what="the latch set")
    node = fleet.get_node(n1)
    health = node["status"]["health"]
    # The expiry of the last renewal the operator observed, on its own clock: the
    # moment it saw that renewal (just after it was written), plus the lease.
    since = parse_time(health["unhealthySince"])
    assert since is not None
    expiry = deadline - timedelta(seconds=3)
    assert expiry <= since < expiry + timedelta(seconds=1), (
        "unhealthySince must be the lease's expiry, not when it was noticed"
    )
    assert health["handledCount"] == 3
    assert node["status"]["phase"] == "NotReady"
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LeaseExpired")


def test_node_that_renews_within_grace_keeps_every_sandbox(fleet, operators):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1)
    fleet.sandbox("keep", n1, "Running")
    operators("--grace-period", "4s", "--resync-interval", "1s")
    wait_for(
        lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    last = lease.pause()
    wait_for(
        lambda: fleet.health(n1).get("unhealthySince"),
        timeout=10,
        what="the operator to start tracking the NotReady node",
    )
    lease.resume()  # the agent comes back inside the grace period
    wait_for(
        lambda: fleet.get_node(n1)["status"]["phase"] == "Ready",
        timeout=10,
        what="node Ready again",
    )
    # Stay past the moment the grace would have ended.
    past = last + timedelta(seconds=2 + 4 + 1)
    while datetime.now(UTC) < past:
        assert fleet.phase("keep") == "Running"
        time.sleep(0.2)
    assert fleet.phase("keep") == "Running"
    assert not any(fleet.health(n1).values()), "tracking left behind after recovery"


def test_disabled_node_is_never_reaped(fleet, operators):
    drained = fleet.node("drained", unschedulable=True)
    fleet.sandbox("draining", drained, "Running")
    ready = fleet.node("ready")
    fleet.lease(ready)
    op = operators(*FAST)
    wait_for(
        lambda: fleet.get_node(drained).get("status", {}).get("phase") == "Disabled",
        timeout=15,
        what="drained node Disabled",
    )
    # A whole grace period with the lease absent, then passes over both nodes
    # (each is resynced every second): the loop looked, and left it alone.
    wait_node_passes_after(op, time.monotonic() + 3 + 1, 2 * 2, timeout=30)
    assert fleet.phase("draining") == "Running"
    assert not fleet.health(drained).get("unhealthySince")


class ListedThen(Objects):
    """The real Objects, running ``after`` once a node's first page is read: another
    writer moving the sandboxes on between the marker's listing and its writes."""

    def __init__(self, api: client.ApiClient, after: Callable[[], None]) -> None:
        super().__init__(api)
        self.after = after

    def node_sandboxes_page(
        self, node: str, limit: int, token: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        page = super().node_sandboxes_page(node, limit, token)
        self.after()
        return page


def mark_node(objects: Objects, node: str, now: datetime) -> NodeMarking:
    """One pass of the operator's own Marker over ``node``, as the leader."""
    marker = Marker(
        objects, OperatorMetrics(CollectorRegistry()), concurrency=4, is_leader=lambda: True
    )
    return asyncio.run(marker.mark_node(node, "NodeLost", "test", now))


def test_marking_retries_a_conflict_and_respects_a_terminal_reread(kube, fleet):
    n1 = fleet.node("n1", lease=False)
    fleet.sandbox("bumped", n1, "Running")
    fleet.sandbox("raced", n1, "Running")

    def another_writer() -> None:
        # After the marker's read: one is only relabelled, the other reaches a
        # terminal phase first.
        fleet.objs.patch_namespaced_custom_object(
            "sandlot.dev",
            "v1alpha1",
            fleet.namespace,
            "sandboxes",
            "bumped",
            {"metadata": {"labels": {"touched": "yes"}}},
        )
        fleet.set_phase("raced", "Stopped", reason="Exited", exitCode=3)

    result = mark_node(ListedThen(kube, another_writer), n1, datetime.now(UTC))

    assert result.complete, result
    assert sorted(result.marked) == [f"{fleet.namespace}/bumped"]
    assert sorted(result.already_terminal) == [f"{fleet.namespace}/raced"]
    assert fleet.phase("bumped") == "Dead"
    assert fleet.get("bumped")["metadata"]["labels"]["touched"] == "yes"
    assert fleet.get("raced")["status"]["reason"] == "Exited", "a terminal sandbox was overwritten"


def test_marking_dead_keeps_every_other_condition(kube, fleet):
    n1 = fleet.node("n1")
    fleet.sandbox("sb", n1, None)
    earlier = "2030-01-01T00:00:00Z"
    fleet.set_phase(
        "sb",
        "Running",
        conditions=[
            {"type": "Scheduled", "status": "True", "reason": "Bound",
             "message": "bound to n1", "lastTransitionTime": earlier},
            {"type": "Ready", "status": "True", "reason": "Started",
             "message": "running", "lastTransitionTime": earlier},
            {"type": "example.com/Probe", "status": "True", "reason": "Healthy",
             "message": "another controller's", "lastTransitionTime": earlier},
        ],
    )  # fmt: skip
    now = datetime.now(UTC).replace(microsecond=0)
    result = mark_node(Objects(kube), n1, now)
    assert result.marked == [f"{fleet.namespace}/sb"], result
    conditions = {c["type"]: c for c in fleet.get("sb")["status"]["conditions"]}
    assert set(conditions) == {"Scheduled", "Ready", "example.com/Probe"}, conditions
    assert conditions["Scheduled"]["reason"] == "Bound"
    assert conditions["example.com/Probe"]["lastTransitionTime"] == earlier
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "NodeLost")
    assert parse_time(ready["lastTransitionTime"]) == now


@pytest.fixture
def deny_status_of_labelled(kube):
    """A ValidatingAdmissionPolicy refusing status writes to sandboxes labelled
    sandlot.test/deny-status=true: a real, server-side failure for one sandbox."""
    adm: Any = client.AdmissionregistrationV1Api(kube)
    name = f"deny-status-{int(time.time() * 1000) % 100000}"
    adm.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["sandlot.dev"],
                            "apiVersions": ["v1alpha1"],
                            "operations": ["UPDATE"],
                            "resources": ["sandboxes/status"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.metadata.labels) || !('sandlot.test/deny-status' in "
                        "object.metadata.labels)",
                        "message": "status writes are denied for this test sandbox",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }
    )
    yield name
    adm.delete_validating_admission_policy_binding(name)
    adm.delete_validating_admission_policy(name)


def test_a_failed_mark_leaves_the_latch_unset_and_the_next_pass_finishes(
    fleet, operators, deny_status_of_labelled
):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1)
    fleet.sandbox("ok", n1, "Running")
    fleet.sandbox("stuck", n1, "Running")
    fleet.objs.patch_namespaced_custom_object(
        "sandlot.dev",
        "v1alpha1",
        fleet.namespace,
        "sandboxes",
        "stuck",
        {"metadata": {"labels": {"sandlot.test/deny-status": "true"}}},
    )

    # The policy takes effect asynchronously: wait until it refuses a write.
    def refused() -> bool:
        try:
            fleet.set_phase("stuck", "Running")
            return False
        except client.ApiException as e:
            return bool(e.status == 422 or e.status == 403)

    wait_for(refused, timeout=20, what="the admission policy to refuse status writes")
    # The default resync (30 s): the retry must come from the failure's own backoff
    # (2 s), not from the next resync.
    op = operators("--grace-period", "3s")
    wait_for(
        lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    lease.pause()
    wait_for(lambda: fleet.phase("ok") == "Dead", timeout=20, what="the writable sandbox Dead")
    wait_for(
        lambda: op.metric("sandlot_operator_mark_failures_total") >= 2,
        timeout=15,
        what="the failing mark to be retried",
    )
    assert not fleet.health(n1).get("handledAt"), "latch set after a partial failure"
    assert fleet.phase("stuck") == "Running"

    fleet.objs.patch_namespaced_custom_object(
        "sandlot.dev",
        "v1alpha1",
        fleet.namespace,
        "sandboxes",
        "stuck",
        {"metadata": {"labels": {"sandlot.test/deny-status": None}}},
    )
    wait_for(
        lambda: fleet.phase("stuck") == "Dead",
        timeout=10,
        what="the retry to finish within its backoff, well before the 30 s resync",
    )
    wait_for(lambda: fleet.health(n1).get("handledAt"), timeout=10, what="latch set")
    assert fleet.get("ok")["status"]["reason"] == "NodeLost"


def test_operator_restart_mid_grace_keeps_the_original_deadline(fleet, operators):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1)
    fleet.sandbox("s", n1, "Running")
    flags = ("--grace-period", "6s", "--resync-interval", "1s")
    first = operators(*flags)
    wait_for(
        lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    lease.pause()
    since = wait_for(
        lambda: fleet.health(n1).get("unhealthySince"), timeout=10, what="tracking to start"
    )
    first.stop()  # a rolling restart: SIGTERM, the leader Lease is released
    time.sleep(2.5)  # the grace keeps running while no operator is up
    operators(*flags)
    # Up and serving: a new episode could begin no earlier than now, and would end no
    # earlier than a lease (2 s) plus the grace (6 s) from now. The kept deadline has
    # passed already, so the mark comes once the fresh view has waited one lease.
    up_at = datetime.now(UTC)
    wait_for(lambda: fleet.phase("s") == "Dead", timeout=20, what="the sandbox Dead")
    assert fleet.health(n1)["unhealthySince"] == since
    began = parse_time(since)
    assert began is not None, since
    deadline = began + timedelta(seconds=6)
    assert marked_at(fleet, "s") < up_at + timedelta(seconds=6), (
        "the restarted operator began a new grace period instead of keeping the deadline "
        f"{deadline}"
    )


def test_killing_the_active_of_two_operators_mid_grace_still_reaps(fleet, operators):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1)
    fleet.sandbox("s", n1, "Running")
    flags = ("--grace-period", "8s", "--resync-interval", "1s")
    a = operators(*flags)
    b = operators(*flags)
    leader = wait_for(
        lambda: next((o for o in (a, b) if o.is_leader()), None),
        timeout=20,
        what="one operator to lead",
    )
    standby = b if leader is a else a
    assert not standby.is_leader(), "both operators claim leadership"
    wait_for(
        lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    lease.pause()
    wait_for(lambda: fleet.health(n1).get("unhealthySince"), timeout=10, what="tracking")
    killed = time.monotonic()
    leader.kill()
    wait_for(standby.is_leader, timeout=20, what="the standby to take over")
    failover = time.monotonic() - killed
    wait_for(lambda: fleet.phase("s") == "Dead", timeout=25, what="the node reaped")
    print(f"failover after SIGKILL: {failover:.1f}s")
    assert failover < 20


def test_a_handled_node_costs_no_api_call_per_pass(fleet, operators):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1)
    fleet.sandbox("s", n1, "Running")
    op = operators(*FAST)
    wait_for(
        lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    lease.pause()
    wait_for(lambda: fleet.health(n1).get("handledAt"), timeout=20, what="node handled")
    # The pass that set the latch and the next have ended: their writes are done.
    wait_node_passes(op, node_passes(op), 2, timeout=20)

    def calls() -> float:
        return float(
            sum(
                op.metric("sandlot_operator_api_requests_total", resource=r)
                for r in ("sandboxes", "sandboxnodes", "events")
            )
        )

    before = calls()
    assert before > 0, "the request counter never moved: comparing it would prove nothing"
    wait_node_passes(op, node_passes(op), 4, timeout=20)  # resync passes at 1 s
    assert calls() == before, "a handled node cost API calls on resync"


def test_mass_failure_guard_holds_then_resumes(fleet, operators):
    nodes = [fleet.node(f"m{i}") for i in range(3)]
    leases = [fleet.lease(n) for n in nodes]
    for i, n in enumerate(nodes):
        fleet.sandbox(f"s{i}", n, "Running")
    op = operators(*FAST)
    for n in nodes:
        wait_for(
            partial(lambda n: fleet.get_node(n).get("status", {}).get("phase") == "Ready", n),
            timeout=15,
            what=f"{n} Ready",
        )
    leases[0].pause()
    leases[1].pause()  # 2 of 3 NotReady: 0.67 >= 0.55
    paused = time.monotonic()
    wait_for(
        lambda: op.metric("sandlot_operator_mass_failure_hold") == 1,
        timeout=20,
        what="the guard to hold",
    )
    # Past lease expiry plus grace, then passes over the three nodes: the held
    # nodes were looked at after their grace ran out, and nothing was reaped.
    wait_node_passes_after(op, paused + 2 + 3 + 1, 2 * 3, timeout=30)
    assert op.metric("sandlot_operator_mass_failure_hold") == 1, "the guard let go meanwhile"
    assert fleet.phase("s0") == "Running" and fleet.phase("s1") == "Running"
    cond = next(
        c for c in fleet.get_node(nodes[0])["status"]["conditions"] if c["type"] == "GuardHolding"
    )
    assert cond["status"] == "True"

    leases[1].resume()  # 1 of 3 NotReady: below the threshold
    wait_for(lambda: fleet.phase("s0") == "Dead", timeout=20, what="s0 reaped after the hold")
    assert fleet.phase("s1") == "Running" and fleet.phase("s2") == "Running"
    assert op.metric("sandlot_operator_mass_failure_hold") == 0


def test_nodes_handled_long_ago_do_not_hold_the_guard_over_a_new_failure(fleet, operators):
    # Six nodes lost and handled an hour ago (their status says so; no Lease), four
    # healthy, one newly lost. Counted, the past outage would be 7/11 NotReady and
    # hold the new failure forever; outside the guard window it is 1/5.
    hour_ago = rfc3339(datetime.now(UTC) - timedelta(hours=1))
    for i in range(6):
        stale = fleet.node(f"old{i}")
        fleet.objs.patch_cluster_custom_object_status(
            "sandlot.dev", "v1alpha1", "sandboxnodes", stale,
            {"status": {"phase": "NotReady", "health": {
                "unhealthySince": hour_ago, "handledAt": hour_ago, "handledCount": 0}}},
        )  # fmt: skip
    healthy = [fleet.node(f"ok{i}") for i in range(4)]
    for n in healthy:
        fleet.lease(n)
    lost = fleet.node("lost")
    lease = fleet.lease(lost)
    fleet.sandbox("gone", lost, "Running")
    op = operators(*FAST, "--guard-window", "10m")
    wait_for(
        lambda: fleet.get_node(lost).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="the node Ready first",
    )
    lease.pause()
    wait_for(lambda: fleet.phase("gone") == "Dead", timeout=20, what="the new failure reaped")
    assert op.metric("sandlot_operator_mass_failure_hold") == 0


def test_deleting_a_node_marks_its_sandboxes_dead(fleet, operators):
    n1 = fleet.node("n1")
    fleet.lease(n1)
    fleet.sandbox("s", n1, "Running")
    operators(*FAST)
    wait_for(
        lambda: (
            "sandlot.dev/node-health" in (fleet.get_node(n1)["metadata"].get("finalizers") or [])
        ),
        timeout=15,
        what="the operator's finalizer on the node",
    )
    fleet.objs.delete_cluster_custom_object("sandlot.dev", "v1alpha1", "sandboxnodes", n1)
    wait_for(lambda: fleet.phase("s") == "Dead", timeout=15, what="the sandbox Dead")
    assert fleet.get("s")["status"]["reason"] == "NodeDeleted"
