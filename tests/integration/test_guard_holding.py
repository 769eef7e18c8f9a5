"""A guard that holds for good is raised, and a person's decision ends it for one node:
a real ``sandlot operator`` against the real API server, three nodes of which two stop
renewing (the guard holds), then ``sandlot nodes reap`` on one of them."""

from __future__ import annotations

import subprocess
import sys
import time
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from tests.support.operator import Fleet
from tests.support.passes import node_passes, wait_node_passes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

FAST = ("--grace-period", "3s", "--resync-interval", "1s")


def condition(fleet: Fleet, node: str, type_: str) -> dict[str, Any] | None:
    conditions = (fleet.get_node(node).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def events(fleet: Fleet, node: str, reason: str) -> list[Any]:
    found = client.CoreV1Api(fleet.api).list_event_for_all_namespaces(
        field_selector=f"involvedObject.name={node},reason={reason}"
    )
    return list(found.items)


def sandlot(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", *args, "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_a_lasting_hold_is_raised_and_a_reap_decision_marks_only_its_node(
    fleet, operators, control_plane
):
    nodes = [fleet.node(f"g{i}") for i in range(3)]
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
    leases[1].pause()  # 2 of 3 NotReady for good: 0.67 >= 0.55
    wait_for(
        lambda: op.metric("sandlot_operator_guard_held_seconds") > 0,
        timeout=30,
        what="the guard to hold a node past its grace (sandlot_operator_guard_held_seconds)",
    )
    for n in nodes[:2]:
        wait_for(
            partial(
                lambda n: (condition(fleet, n, "GuardHolding") or {}).get("status") == "True", n
            ),
            timeout=15,
            what=f"GuardHolding=True on {n}",
        )
        wait_for(
            partial(
                lambda n: any(
                    "held this node" in e.message for e in events(fleet, n, "MassFailureHold")
                ),
                n,
            ),
            timeout=15,
            what=f"a MassFailureHold Event on {n} saying for how long",
        )
    assert condition(fleet, nodes[2], "GuardHolding") is None, "a Ready node is not held"
    held = op.metric("sandlot_operator_guard_held_seconds")
    time.sleep(2)
    assert op.metric("sandlot_operator_guard_held_seconds") >= held + 1, "the hold's age grows"
    assert [fleet.phase(f"s{i}") for i in range(3)] == ["Running"] * 3, "the guard reaped"

    kubeconfig = str(control_plane.kubeconfig)
    refused = sandlot(kubeconfig, "nodes", "reap", nodes[2])
    assert refused.returncode == 2 and "not NotReady" in refused.stderr, refused
    done = sandlot(kubeconfig, "nodes", "reap", nodes[0], "--reason", "zone a is gone")
    assert done.returncode == 0, done
    assert "1 sandboxes marked Dead" in done.stdout, done.stdout

    dead = fleet.get("s0")["status"]
    assert (dead["phase"], dead["reason"]) == ("Dead", "ManualReap")
    assert fleet.phase("s1") == "Running", "the other held node was reaped too"
    assert fleet.phase("s2") == "Running"
    spec = fleet.get_node(nodes[0])["spec"]["reap"]
    assert spec["reason"] == "zone a is gone" and spec["requestedBy"], spec
    assert events(fleet, nodes[0], "ManualReap"), "no ManualReap Event on the reaped node"
    assert condition(fleet, nodes[0], "GuardHolding") is None
    wait_node_passes(op, node_passes(op), 2, timeout=20)  # the guard still holds the other node
    assert fleet.phase("s1") == "Running"
    assert op.metric("sandlot_operator_mass_failure_hold") == 1
