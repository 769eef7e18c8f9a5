"""A marking pass stops for a node that came back, against the real API server: a
real ``sandlot operator`` marks a lost node's 1,000 sandboxes Dead, and the node's
Lease is renewed while those marks are in flight. Lease 2 s, grace 3 s."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from sandlot.api import GROUP, VERSION
from tests.support.operator import Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LEASE, GRACE = 2, 3
SANDBOXES = 1000
BATCH = 16  # the operator's mark_concurrency (its default): the writes in flight at once
SANDBOX_WRITES = "sandlot_operator_api_requests_total"


def sandbox_writes(op: OperatorProcess) -> float:
    """Status writes the operator sent to sandboxes (counted as each is sent)."""
    return op.metric(SANDBOX_WRITES, verb="PATCH", resource="sandboxes")


def phases_on(fleet: Fleet, node: str) -> dict[str, int]:
    listed: Any = fleet.objs.list_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxes"
    )
    counts: dict[str, int] = {}
    for item in listed["items"]:
        if item["spec"].get("nodeName") == node:
            phase = (item.get("status") or {}).get("phase", "")
            counts[phase] = counts.get(phase, 0) + 1
    return counts


def test_a_node_that_renews_while_its_sandboxes_are_marked_stops_its_marking(
    fleet: Fleet, operators, kube: client.ApiClient
) -> None:
    big = fleet.node("big")
    lease = fleet.lease(big, LEASE)
    for other in (fleet.node("n1"), fleet.node("n2")):  # 1 of 3 lost: no mass failure
        fleet.lease(other, LEASE)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: fleet.sandbox(f"sb{i}", big, "Running"), range(SANDBOXES)))
    op = operators("--grace-period", f"{GRACE}s", "--resync-interval", "1s")
    wait_for(
        lambda: (fleet.get_node(big).get("status") or {}).get("phase") == "Ready",
        timeout=30,
        what="the node Ready",
    )
    baseline = sandbox_writes(op)
    lease.pause()  # the agent stops renewing

    # Once the marks are in flight, the agent comes back.
    first = wait_for(
        lambda: sandbox_writes(op) > baseline + BATCH and sandbox_writes(op),
        timeout=LEASE + GRACE + 20,
        what="the operator to send its first marks",
        interval=0.01,
    )
    lease.renew()
    sent_before = sandbox_writes(op) - baseline  # an upper bound of what landed before
    renewed = time.monotonic()
    lease.resume()
    assert first - baseline < SANDBOXES / 2, "the renewal came too late to stop anything"

    # The pass ends: the writes stop and the node is Ready again.
    def settled() -> bool:
        a = sandbox_writes(op)
        time.sleep(1.0)
        return a == sandbox_writes(op)

    wait_for(settled, timeout=60, what="the operator's sandbox writes to stop")
    wait_for(
        lambda: (fleet.get_node(big).get("status") or {}).get("phase") == "Ready",
        timeout=10,
        what="the node Ready again",
    )
    phases = phases_on(fleet, big)
    dead = phases.get("Dead", 0)
    after = dead - sent_before
    assert dead > 0, f"nothing was marked: {phases}"
    assert after <= BATCH, (
        f"{after:.0f} sandboxes marked Dead after the renewal was written "
        f"({dead} Dead of {SANDBOXES}; {sent_before:.0f} marks sent before it, "
        f"{time.monotonic() - renewed:.1f}s ago)"
    )
    assert phases.get("Running", 0) == SANDBOXES - dead, phases
    assert op.proc.poll() is None, f"the operator died:\n{op.log()}"
