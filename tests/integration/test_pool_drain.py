"""Draining a node end to end (``sandlot drain``) on the cluster of
tests/support/pools.py: members move off it and none goes Dead; a drain that
cannot finish times out naming what is left."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from sandlot.cli.main import main as sandlot_main
from tests.support.operator import Fleet
from tests.support.passes import wait_node_passes_after
from tests.support.pools import (
    GRACE_SECONDS,
    LEASE_SECONDS,
    Cluster,
    Start,
    node_of,
    phase,
    start_operator,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def test_drain_moves_members_off_the_node_and_none_goes_dead(
    cluster: Cluster, operators: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = (cluster.add_node(n) for n in ("a", "b", "c"))
    op = start_operator(cluster, operators)
    cluster.create_pool("api", 6, service="api")
    running = cluster.wait_running("api", 6)
    on_a = {m["metadata"]["name"] for m in running if node_of(m) == a.name}
    assert len(on_a) == 2

    assert cluster.sandlot("drain", a.name, "--timeout", "60s") == 0
    # Whether a progress line comes first is a race between the CLI's first listing
    # and the agent stopping its members (the next test shows the line itself).
    out = capsys.readouterr().out
    assert f"node {a.name} drained" in out, out

    members = {m["metadata"]["name"]: m for m in cluster.members("api")}
    for name in on_a:
        assert (phase(members[name]), members[name]["status"]["reason"]) == ("Stopped", "Drained")
    assert not [n for n, m in members.items() if phase(m) == "Dead"]
    live = cluster.wait_running("api", 6)
    assert Counter(node_of(m) for m in live) == {b.name: 3, c.name: 3}
    assert not a.containers(), "the drained node's containers should be gone"
    wait_for(
        lambda: cluster.slice_targets("api") == {m["metadata"]["name"] for m in live},
        timeout=10,
        what="the EndpointSlice to list the members on b and c only",
    )
    wait_for(lambda: cluster.node_phase(a.name) == "Disabled", timeout=10, what="a Disabled")
    # A whole lease and grace period, then node-health passes over the three nodes
    # (each resynced every second): the loop looked at the Disabled node, and
    # nothing went Dead.
    wait_node_passes_after(op, time.monotonic() + LEASE_SECONDS + GRACE_SECONDS, 2 * 3, timeout=30)
    assert not [m for m in cluster.members("api") if phase(m) == "Dead"]

    assert cluster.sandlot("uncordon", a.name) == 0
    wait_for(lambda: cluster.node_phase(a.name) == "Ready", timeout=10, what="a Ready again")


def test_drain_times_out_naming_what_is_left(fleet: Fleet, capsys, control_plane) -> None:
    node = fleet.node("gone")  # no agent: nothing will stop its sandbox
    fleet.sandbox("stuck", node, "Running")
    code = sandlot_main(
        ["drain", node, "--timeout", "1s", "--kubeconfig", str(control_plane.kubeconfig)]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert f"1 sandboxes still on {node}" in out
    assert f"{fleet.namespace}/stuck" in out and "timed out" in out
    assert fleet.get_node(node)["spec"]["unschedulable"] is True
