"""A lost node's pushed suspended sandbox, against the real API server and a real
``sandlot operator`` (SPEC sections 2-3 and 8): it is moved to another node only
when node health would mark a sandbox Dead: not within the node's grace period,
not while the mass-failure guard holds, once the node is handled. A NotReady node
may only be cut off, its agent alive: a move before then could leave two nodes
running the sandbox. Leases are written as agents write them (2 s), the grace is
short (3 s); no agent runs, so nothing restores the sandbox anywhere."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import rfc3339
from tests.support.operator import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LEASE, GRACE = 2, 3
FAST = ("--grace-period", f"{GRACE}s", "--resync-interval", "1s")


def roomy(fleet: Fleet, name: str) -> str:
    """A node with room for sandboxes (its agent would report it)."""
    node = fleet.node(name)
    fleet.objs.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", node, {"status": {"capacity": {"sandboxes": 5}}}
    )
    return node


def pushed_suspended(fleet: Fleet, name: str, node: str) -> None:
    """A sandbox on ``node`` suspended there with its state pushed to a registry."""
    fleet.sandbox(name, node, None)
    digest = "sha256:" + "0" * 64
    fleet.set_phase(
        name,
        "Running",
        conditions=[
            {
                "type": "Suspended",
                "status": "True",
                "reason": "Suspended",
                "message": "filesystem committed, pushed",
                "lastTransitionTime": rfc3339(datetime.now(UTC)),
            }
        ],
        suspendedState={"image": f"reg.example/state:{name}@{digest}", "digest": digest,
                        "node": node},
    )  # fmt: skip


def node_of(fleet: Fleet, name: str) -> str | None:
    spec: dict[str, Any] = fleet.get(name).get("spec") or {}
    return spec.get("nodeName")


def stays_until(fleet: Fleet, name: str, node: str, until: datetime, why: str) -> None:
    """``name`` stays bound to ``node`` until ``until`` (looked at every 0.1 s)."""
    while datetime.now(UTC) < until:
        assert node_of(fleet, name) == node, f"{name} moved off {node} {why}"
        time.sleep(0.1)


def ready(fleet: Fleet, *nodes: str) -> None:
    for node in nodes:
        wait_for(
            partial(lambda n: fleet.get_node(n).get("status", {}).get("phase") == "Ready", node),
            timeout=15,
            what=f"node {node} Ready while its lease is renewed",
        )


def test_a_lost_nodes_pushed_sandbox_stays_through_its_grace_then_moves(fleet, operators):
    a, b = roomy(fleet, "a"), roomy(fleet, "b")
    lease = fleet.lease(a, duration=LEASE)
    fleet.lease(b, duration=LEASE)
    pushed_suspended(fleet, "pushed", a)
    operators(*FAST)
    ready(fleet, a, b)

    last = lease.pause()
    wait_for(
        lambda: fleet.get_node(a).get("status", {}).get("phase") == "NotReady",
        timeout=10,
        what="node a NotReady once its lease ran out",
    )
    # The grace ends a lease plus the grace after the last renewal; stop looking a
    # little before it (the renewal was observed just after it was written).
    grace_end = last + timedelta(seconds=LEASE + GRACE)
    stays_until(fleet, "pushed", a, grace_end - timedelta(milliseconds=300), "within its grace")
    wait_for(lambda: node_of(fleet, "pushed") == b, timeout=20, what="the sandbox moved to b")
    assert fleet.health(a).get("handledAt"), "moved before node health handled node a"
    assert fleet.phase("pushed") == "Running", "a moved sandbox keeps its phase"


def test_a_pushed_sandbox_is_not_moved_while_the_guard_holds_and_moves_once_it_lifts(
    fleet, operators
):
    a, b, c = roomy(fleet, "a"), roomy(fleet, "b"), roomy(fleet, "c")
    lease_a = fleet.lease(a, duration=LEASE)
    fleet.lease(b, duration=LEASE)
    lease_c = fleet.lease(c, duration=LEASE)
    pushed_suspended(fleet, "pushed", a)
    op = operators(*FAST)
    ready(fleet, a, b, c)

    last = lease_a.pause()
    lease_c.pause()  # 2 of 3 NotReady: the guard holds (0.67 >= 0.55)
    wait_for(
        lambda: op.metric("sandlot_operator_mass_failure_hold") == 1,
        timeout=20,
        what="the mass-failure guard to hold",
    )
    past_grace = last + timedelta(seconds=LEASE + GRACE + 1)
    stays_until(fleet, "pushed", a, past_grace, "while the guard held its node")
    assert not fleet.health(a).get("handledAt"), "node a handled while the guard held"

    lease_c.resume()  # 1 of 3 NotReady: the guard lets node a be handled
    wait_for(lambda: node_of(fleet, "pushed") in (b, c), timeout=20, what="the sandbox moved off a")
    assert fleet.health(a).get("handledAt"), "moved before node health handled node a"
