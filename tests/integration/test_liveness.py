"""Liveness on the operator's own clock, against the real API server: agents whose
clocks are skewed either way, and a Lease deleted under a healthy node. Real
``sandlot operator`` processes; lease 2 s, grace 3 s."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import parse_time
from tests.support.kube import start_private_plane
from tests.support.operator import Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LEASE, GRACE = 2, 3
FAST = ("--grace-period", f"{GRACE}s", "--resync-interval", "1s")


def node_phase(fleet: Fleet, node: str) -> str | None:
    return (fleet.get_node(node).get("status") or {}).get("phase")


def hold(seconds: float, check, what: str) -> None:  # type: ignore[no-untyped-def]
    """Assert ``check()`` on every poll for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), what
        time.sleep(0.2)


def test_an_agent_clock_ten_minutes_slow_that_renews_keeps_its_node_ready_past_grace(
    fleet, operators
):
    n1 = fleet.node("n1")
    fleet.lease(n1, LEASE, skew=-timedelta(minutes=10))
    fleet.sandbox("slow", n1, "Running")
    operators(*FAST)
    wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=15, what="node Ready")
    # Judged against the operator's clock its stamps are 10 minutes stale; it renews
    # every 0.5 s all the same, so it must stay Ready and keep its sandbox well past
    # lease + grace.
    hold(
        LEASE + GRACE + 3,
        lambda: fleet.phase("slow") == "Running" and node_phase(fleet, n1) == "Ready",
        "a node renewing with a slow clock was judged dead",
    )
    assert not fleet.health(n1).get("unhealthySince")


def test_an_agent_clock_ten_minutes_fast_that_stops_goes_not_ready_after_its_lease(
    fleet, operators
):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1, LEASE, skew=timedelta(minutes=10))
    fleet.sandbox("fast", n1, "Running")
    operators(*FAST)
    wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=15, what="node Ready")
    lease.pause()
    stopped = datetime.now(UTC)
    # Its last stamp says "valid for 10 more minutes"; the operator's clock says the
    # renewal it saw is LEASE seconds old.
    wait_for(
        lambda: node_phase(fleet, n1) == "NotReady",
        timeout=LEASE + 5,
        what="NotReady one lease after the last renewal (not 10 minutes later)",
    )
    since = parse_time(fleet.health(n1)["unhealthySince"])
    assert since is not None
    assert abs((since - (stopped + timedelta(seconds=LEASE))).total_seconds()) < 1.5
    wait_for(lambda: fleet.phase("fast") == "Dead", timeout=GRACE + 10, what="Dead after grace")
    finished = parse_time(fleet.get("fast")["status"]["finishedAt"])
    assert finished is not None and finished >= since + timedelta(seconds=GRACE)


def test_deleting_a_healthy_nodes_lease_marks_nothing_dead(
    fleet, operators, kube: client.ApiClient
):
    n1 = fleet.node("n1")
    lease = fleet.lease(n1, LEASE)
    fleet.sandbox("kept", n1, "Running")
    operators(*FAST)
    wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=15, what="node Ready")
    time.sleep(LEASE + GRACE)  # the node is older than lease + grace
    lease.pause()
    client.CoordinationV1Api(kube).delete_namespaced_lease(n1, fleet.lease_namespace)
    # The agent recreates it a moment later, as its next renewal does.
    time.sleep(1)
    lease.resume()
    hold(
        LEASE + GRACE + 2,
        lambda: fleet.phase("kept") == "Running",
        "a deleted Lease was taken for a death",
    )
    assert node_phase(fleet, n1) == "Ready"


def test_a_frozen_api_server_longer_than_the_view_bound_marks_nothing_dead(tmp_path):
    """SIGSTOP keeps every connection open and silent: a watch that is never told it
    died. The agent is cut off as long and renews a moment after the API server is
    back (within one lease), as agents whose next renewal is due do. One node (fewer
    than the mass-failure guard counts), so only the lease view's own bounds can save
    it: the operator must not reap from the view it had before the freeze."""
    plane = start_private_plane(tmp_path / "cp", namespaces=("work", "sandlot-system"))
    api = load_api_client(str(plane.kubeconfig), pool_size=8)
    fleet = Fleet(api, "work", "sandlot-system")
    op = None
    try:
        n1 = fleet.node("n1")
        lease = fleet.lease(n1, LEASE)
        fleet.sandbox("kept", n1, "Running")
        op = OperatorProcess(plane, tmp_path, "sandlot-system", *FAST,
                             "--lease-view-max-age", "4s")  # fmt: skip
        op.wait_metrics()
        wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=20, what="node Ready")
        apiserver = plane.pids()["kube-apiserver"]
        lease.pause()  # the agent is cut off with it
        os.kill(apiserver, signal.SIGSTOP)
        try:
            time.sleep(4 * 3)  # three view bounds, and lease + grace twice over
        finally:
            os.kill(apiserver, signal.SIGCONT)
        time.sleep(LEASE * 0.75)
        lease.resume()
        wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=30,
                 what="the node Ready again once the views recovered")  # fmt: skip
        hold(
            LEASE + GRACE + 2,
            lambda: fleet.phase("kept") == "Running",
            "the operator reaped from a view frozen with the API server",
        )
        assert fleet.phase("kept") == "Running"
        assert op.proc.poll() is None, f"the operator died:\n{op.log()}"
    finally:
        if op is not None:
            op.stop()
        fleet.cleanup()
        api.close()
        plane.stop()
