"""Placing pool members end to end on the cluster of tests/support/pools.py: a full
node gets nothing more and the member waits saying why until room appears; a
binding with a stale resource version never rebinds."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from tests.support.pools import IMAGE, Cluster, Start, node_of, phase, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def test_full_node_gets_nothing_more_and_the_sandbox_waits_saying_why(
    cluster: Cluster, operators: Start
) -> None:
    a = cluster.add_node("a", capacity=2)
    start_operator(cluster, operators)
    cluster.create_pool("batch", 3)

    def waiting() -> dict[str, Any] | None:
        pending = [m for m in cluster.members("batch") if phase(m) == "Pending"]
        if len(pending) != 1:
            return None
        cond = next(
            (
                c
                for c in (pending[0].get("status") or {}).get("conditions", [])
                if c["type"] == "Scheduled"
            ),
            None,
        )
        return pending[0] if cond and cond["status"] == "False" else None

    stuck = wait_for(waiting, timeout=30, what="one member Pending with Scheduled=False")
    cond = next(c for c in stuck["status"]["conditions"] if c["type"] == "Scheduled")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == "0/1 nodes are available: 1 at capacity"
    assert node_of(stuck) is None
    wait_for(
        lambda: len([m for m in cluster.running("batch") if node_of(m) == a.name]) == 2,
        timeout=20,
        what="the two members that fit Running on the full node",
    )
    wait_for(
        lambda: cluster.pool("batch").get("status", {}).get("pending") == 1,
        timeout=10,
        what="pool status pending=1",
    )

    # Room appears (a new node becomes Ready): the waiting member is placed there.
    b = cluster.add_node("b", capacity=2)
    running = cluster.wait_running("batch", 3, timeout=30)
    assert Counter(node_of(m) for m in running) == {a.name: 2, b.name: 1}
    placed = next(m for m in running if m["metadata"]["name"] == stuck["metadata"]["name"])
    assert node_of(placed) == b.name


def test_binding_with_a_stale_resource_version_never_rebinds(
    kube: client.ApiClient, namespace: str
) -> None:
    from sandlot.adapters.objects import Objects
    from sandlot.adapters.workloads import bind_sandbox

    objs: Any = client.CustomObjectsApi(kube)
    created = objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": "once"},
            "spec": {"image": IMAGE},
        },
    )
    rv = created["metadata"]["resourceVersion"]
    objects = Objects(kube)
    first = bind_sandbox(objects, namespace, "once", "n1", rv)
    second = bind_sandbox(objects, namespace, "once", "n2", rv)  # a second pass, same read
    assert first.outcome == "bound"
    assert second.outcome == "taken"
    assert second.body is not None and second.body["spec"]["nodeName"] == "n1"
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "once", {"status": {"phase": "Pending"}}
    )
    # Changed but still unbound elsewhere: a conflict the caller retries with the new version.
    other = objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": "moved"},
            "spec": {"image": IMAGE},
        },
    )
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "moved", {"status": {"phase": "Pending"}}
    )
    stale = bind_sandbox(objects, namespace, "moved", "n1", other["metadata"]["resourceVersion"])
    assert stale.outcome == "conflict" and stale.body is not None
    retried = bind_sandbox(
        objects, namespace, "moved", "n1", stale.body["metadata"]["resourceVersion"]
    )
    assert retried.outcome == "bound"
