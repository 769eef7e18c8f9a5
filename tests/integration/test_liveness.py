"""Liveness on the operator's own clock, against the real API server: agents whose
clocks are skewed either way, and a Lease deleted under a healthy node. Real
``sandlot operator`` processes; lease 2 s, grace 3 s."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.api.timestamps import parse_time
from tests.support.kube import start_private_plane
from tests.support.operator import Fleet, OperatorProcess
from tests.support.passes import node_passes, wait_node_passes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LEASE, GRACE = 2, 3
FAST = ("--grace-period", f"{GRACE}s", "--resync-interval", "1s")


def node_phase(fleet: Fleet, node: str) -> str | None:
    return (fleet.get_node(node).get("status") or {}).get("phase")


def hold(seconds: float, check, what: str) -> None:
    """Assert ``check()`` on every poll for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), what
        time.sleep(0.2)


def hold_while_looking(
    op: OperatorProcess, base: int, seconds: float, check: Callable[[], bool], what: str
) -> None:
    """``hold`` for ``seconds``, then require the operator to have made a node-health
    pass per second of it past ``base``: "nothing happened" means it looked."""
    hold(seconds, check, what)
    wait_node_passes(op, base, int(seconds), timeout=15)
    assert check(), what


def test_an_agent_clock_ten_minutes_slow_that_renews_keeps_its_node_ready_past_grace(
    fleet, operators
):
    n1 = fleet.node("n1")
    fleet.lease(n1, LEASE, skew=-timedelta(minutes=10))
    fleet.sandbox("slow", n1, "Running")
    op = operators(*FAST)
    wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=15, what="node Ready")
    # Judged against the operator's clock its stamps are 10 minutes stale; it renews
    # every 0.5 s all the same, so it must stay Ready and keep its sandbox well past
    # lease + grace.
    hold_while_looking(
        op,
        node_passes(op),
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
    op = operators(*FAST)
    wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=15, what="node Ready")
    time.sleep(LEASE + GRACE)  # not a wait: the node must be older than lease + grace
    lease.pause()
    client.CoordinationV1Api(kube).delete_namespaced_lease(n1, fleet.lease_namespace)
    deleted = node_passes(op)
    # The operator passes over the node while its Lease is gone; the agent recreates
    # it after that, as its next renewal does.
    wait_node_passes(op, deleted, 1, timeout=10)
    lease.resume()
    hold_while_looking(
        op,
        deleted,
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
            # The freeze itself: three view bounds, and lease + grace twice over.
            time.sleep(4 * 3)
        finally:
            os.kill(apiserver, signal.SIGCONT)
        thawed = node_passes(op)
        time.sleep(LEASE * 0.75)  # the agent's own cut-off outlasts the freeze this long
        lease.resume()
        wait_for(lambda: node_phase(fleet, n1) == "Ready", timeout=30,
                 what="the node Ready again once the views recovered")  # fmt: skip
        hold_while_looking(
            op,
            thawed,
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
