"""minReadySeconds on the operator's own clock, against the real API server and a
real ``sandlot operator`` (SPEC section 8: a decision never compares one machine's
clock with another's). The test plays the node's agent: it writes each member's
``Running`` with a ``startedAt`` from a node clock three hours off, ahead or
behind. A rollout (replicas 1, maxSurge 1, maxUnavailable 0) deletes the old member
once its replacement has been Ready for minReadySeconds as the operator saw it:
not at once (a node clock behind), not hours later (a node clock ahead)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import rfc3339
from tests.support.operator import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MIN_READY = 4
FLAGS = ("--grace-period", "30s", "--resync-interval", "1s")


def members(fleet: Fleet) -> dict[str, dict[str, Any]]:
    found = fleet.objs.list_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxes", label_selector="sandlot.dev/pool=web"
    )["items"]
    return {m["metadata"]["name"]: m for m in found if not m["metadata"].get("deletionTimestamp")}


def run_bound(fleet: Fleet, skew: timedelta) -> list[str]:
    """Play the agent: every Scheduled member becomes Running, started on a node
    clock ``skew`` off. Returns the members it started."""
    started = []
    for name, m in members(fleet).items():
        if (m.get("status") or {}).get("phase") == "Scheduled":
            at = rfc3339(datetime.now(UTC) + skew)
            fleet.set_phase(name, "Running", startedAt=at, ip="10.0.0.9")
            started.append(name)
    return started


def started_one(fleet: Fleet, skew: timedelta, what: str) -> str:
    def bound_and_started() -> str | None:
        names = run_bound(fleet, skew)
        return names[0] if names else None

    return wait_for(bound_and_started, timeout=20, what=what)


@pytest.mark.parametrize(
    "skew", [timedelta(hours=3), timedelta(hours=-3)], ids=["node-3h-ahead", "node-3h-behind"]
)
def test_a_rollout_waits_min_ready_seconds_on_the_operators_clock(
    fleet: Fleet, operators: Any, skew: timedelta
) -> None:
    node = fleet.node("n1")
    fleet.objs.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", node, {"status": {"capacity": {"sandboxes": 5}}}
    )
    fleet.lease(node)
    operators(*FLAGS)
    wait_for(
        lambda: fleet.get_node(node).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    pool = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "minReadySeconds": MIN_READY,
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"spec": {"image": "example.test/app:1"}},
        },
    }
    fleet.objs.create_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxpools", pool
    )
    # The old member counts as available before its replacement does, whatever its
    # stamp: it was seen Ready first.
    old = started_one(fleet, skew, "the first member bound and started")

    fleet.objs.patch_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxpools", "web",
        {"spec": {"template": {"spec": {"image": "example.test/app:2"}}}},
    )  # fmt: skip
    new = started_one(fleet, skew, "the replacement bound and started")
    seen_ready = time.monotonic()
    wait_for(lambda: old not in members(fleet), timeout=MIN_READY + 15, what="old member deleted")
    waited = time.monotonic() - seen_ready
    assert waited >= MIN_READY - 1, (
        f"the old member went {waited:.1f}s after its replacement was Ready, "
        f"before minReadySeconds ({MIN_READY}s)"
    )
    assert new in members(fleet)
