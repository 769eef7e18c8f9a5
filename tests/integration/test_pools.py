"""Pools end to end on the cluster of tests/support/pools.py: members spread over
the nodes, routed through their Service's EndpointSlice and replaced when their
node is lost; the scale subresource scales up and down and removes containers;
finished members go after their TTL, failed ones stay for the back-off."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.runtime import TaskState
from tests.support.pools import (
    GRACE_SECONDS,
    LEASE_SECONDS,
    TERMINAL,
    Cluster,
    Start,
    node_of,
    phase,
    start_operator,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def test_pool_spreads_routes_and_replaces_the_members_of_a_lost_node(
    cluster: Cluster, operators: Start
) -> None:
    a, b, c = (cluster.add_node(n) for n in ("a", "b", "c"))
    start_operator(cluster, operators)
    cluster.create_pool("web", 6, service="web")

    running = cluster.wait_running("web", 6)
    spread = Counter(node_of(m) for m in running)
    assert spread == {a.name: 2, b.name: 2, c.name: 2}, f"not spread 2/2/2: {spread}"
    names = {m["metadata"]["name"] for m in running}
    wait_for(
        lambda: cluster.slice_targets("web") == names,
        timeout=10,
        what="the EndpointSlice to list the 6 Running members",
    )
    es = client.DiscoveryV1Api(cluster.kube).read_namespaced_endpoint_slice(
        "web-sandlot", cluster.namespace
    )
    assert es.metadata and es.metadata.labels and es.ports and es.endpoints, es
    assert es.metadata.labels["kubernetes.io/service-name"] == "web"
    assert es.metadata.labels["endpointslice.kubernetes.io/managed-by"] == "sandlot.dev"
    assert es.address_type == "IPv4"
    assert [(p.name, p.port, p.protocol) for p in es.ports] == [("http", 8080, "TCP")]
    by_name = {m["metadata"]["name"]: m for m in running}
    for ep in es.endpoints:
        assert ep.target_ref and ep.target_ref.name and ep.conditions, ep
        member = by_name[ep.target_ref.name]
        assert ep.addresses == [member["status"]["ip"]]
        assert ep.conditions.ready is True
        assert ep.node_name == node_of(member)
        assert (ep.target_ref.kind, ep.target_ref.uid) == ("Sandbox", member["metadata"]["uid"])
    pool = cluster.pool("web")
    svc = client.CoreV1Api(cluster.kube).read_namespaced_service("web", cluster.namespace)
    assert svc.metadata and svc.spec and svc.spec.ports, svc
    assert svc.spec.selector is None
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("http", 8080, 8080)]
    for owned in (svc.metadata, es.metadata):
        (ref,) = owned.owner_references or []
        assert (ref.kind, ref.uid, ref.controller) == ("SandboxPool", pool["metadata"]["uid"], True)
    member = running[0]
    (ref,) = member["metadata"]["ownerReferences"]
    assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
        pool["metadata"]["uid"],
        True,
        True,
    )
    assert member["metadata"]["labels"] == {"app": "web", "sandlot.dev/pool": "web"}
    assert member["metadata"]["name"].startswith("web-")
    wait_for(
        lambda: cluster.pool("web").get("status", {}).get("running") == 6,
        timeout=10,
        what="pool status running=6",
    )
    status = cluster.pool("web")["status"]
    assert (status["replicas"], status["pending"], status["dead"]) == (6, 0, 0)
    assert status["selector"] == "sandlot.dev/pool=web"

    # Lose node a: its agent stops renewing; its containers keep running.
    lost = {
        m["metadata"]["name"]: m["status"]["containerId"] for m in running if node_of(m) == a.name
    }
    last_renew = cluster.kill_agent(a)
    grace_end = last_renew + timedelta(seconds=LEASE_SECONDS + GRACE_SECONDS)
    out_of_slice: float | None = None
    replaced: float | None = None
    deadline = time.monotonic() + 40
    while out_of_slice is None or replaced is None:
        assert time.monotonic() < deadline, (
            f"lost members not out of the slice ({out_of_slice}) or not replaced ({replaced}) "
            f"within 40s; slice: {cluster.slice_targets('web')}"
        )
        now = datetime.now(UTC)
        if out_of_slice is None:
            targets = cluster.slice_targets("web") or set()
            if not targets & set(lost):
                out_of_slice = (now - grace_end).total_seconds()
        if replaced is None:
            live = cluster.live("web")
            if (
                len(live) == 6
                and all(phase(m) == "Running" for m in live)
                and not any(node_of(m) == a.name for m in live)
            ):
                replaced = (now - grace_end).total_seconds()
        time.sleep(0.05)
    print(
        f"\npool of 6, lease {LEASE_SECONDS}s, grace {GRACE_SECONDS}s: from grace expiry, "
        f"lost members out of the EndpointSlice after {out_of_slice:.2f}s, "
        f"replacements Running after {replaced:.2f}s"
    )
    members = {m["metadata"]["name"]: m for m in cluster.members("web")}
    for name in lost:
        assert phase(members[name]) == "Dead"
        assert members[name]["status"]["reason"] == "NodeLost"
    live = cluster.live("web")
    assert Counter(node_of(m) for m in live) == {b.name: 3, c.name: 3}
    wait_for(
        lambda: cluster.slice_targets("web") == {m["metadata"]["name"] for m in live},
        timeout=10,
        what="the EndpointSlice to list exactly the 6 live members",
    )
    # The lost node's containers are still there, never stopped: nobody could reach
    # them. (A shim slow to answer under load is listed UNKNOWN, not RUNNING.)
    tasks = a.tasks()
    assert set(lost.values()) <= a.containers(), (lost, a.containers())
    assert all(tasks.get(cid) in (TaskState.RUNNING, TaskState.UNKNOWN) for cid in lost.values()), (
        tasks
    )

    # The agent comes back: it fences itself, tearing the Dead members' containers down.
    cluster.start_agent(a)
    wait_for(
        lambda: not (a.containers() & set(lost.values())),
        timeout=20,
        what="the restarted agent to tear down the Dead members' containers",
    )
    members = {m["metadata"]["name"]: m for m in cluster.members("web")}
    assert all(phase(members[n]) == "Dead" for n in lost)
    assert cluster.pool("web")["status"]["dead"] == 2


def test_scale_subresource_scales_up_and_down_and_removes_containers(
    cluster: Cluster, operators: Start, kubectl
) -> None:
    a, b = cluster.add_node("a"), cluster.add_node("b")
    start_operator(cluster, operators)
    cluster.create_pool("svc", 2, service="svc")
    cluster.wait_running("svc", 2)

    kubectl("scale", "-n", cluster.namespace, "sbpool/svc", "--replicas=5")
    five = cluster.wait_running("svc", 5)
    first = sorted(five, key=lambda m: m["metadata"]["creationTimestamp"])

    kubectl("scale", "-n", cluster.namespace, "sbpool/svc", "--replicas=1")
    wait_for(lambda: len(cluster.members("svc")) == 1, timeout=30, what="4 members deleted")
    (kept,) = cluster.members("svc")
    assert kept["metadata"]["creationTimestamp"] == first[0]["metadata"]["creationTimestamp"]
    keep_container = kept["status"]["containerId"]
    wait_for(
        lambda: (a.containers() | b.containers()) == {keep_container},
        timeout=30,
        what="the deleted members' containers to be removed",
    )
    wait_for(
        lambda: cluster.slice_targets("svc") == {kept["metadata"]["name"]},
        timeout=10,
        what="the EndpointSlice to list the one member left",
    )
    scale = kubectl(
        "get", "-n", cluster.namespace, "sbpool/svc", "-o", "jsonpath={.status.replicas}"
    ).stdout
    assert scale == "1"

    # To zero and back, as an autoscaler of an idle pool does.
    kubectl("scale", "-n", cluster.namespace, "sbpool/svc", "--replicas=0")
    wait_for(lambda: not cluster.members("svc"), timeout=30, what="the pool scaled to zero")
    wait_for(lambda: not (a.containers() | b.containers()), timeout=30, what="no container left")
    kubectl("scale", "-n", cluster.namespace, "sbpool/svc", "--replicas=2")
    cluster.wait_running("svc", 2)

    # What a HorizontalPodAutoscaler reads (the scale subresource with the pool's
    # selector) and the HPA object itself, accepted against the pool.
    api: Any = client.CustomObjectsApi(cluster.kube)
    scale_obj = api.get_namespaced_custom_object_scale(
        "sandlot.dev", "v1alpha1", cluster.namespace, "sandboxpools", "svc"
    )
    assert scale_obj["spec"]["replicas"] == 2
    assert scale_obj["status"]["selector"] == "sandlot.dev/pool=svc", scale_obj
    autoscaling: Any = client.AutoscalingV2Api(cluster.kube)  # the body as plain JSON
    hpa = autoscaling.create_namespaced_horizontal_pod_autoscaler(
        cluster.namespace,
        {
            "metadata": {"name": "svc"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "sandlot.dev/v1alpha1",
                    "kind": "SandboxPool",
                    "name": "svc",
                },
                "minReplicas": 1,
                "maxReplicas": 10,
                "metrics": [
                    {
                        "type": "External",
                        "external": {
                            "metric": {"name": "sandlot_operator_pool_ready_members"},
                            "target": {"type": "Value", "value": "2"},
                        },
                    }
                ],
            },
        },
    )
    assert hpa.spec.scale_target_ref.kind == "SandboxPool"


def test_finished_members_are_deleted_after_their_ttl_and_failed_ones_kept(
    cluster: Cluster, operators: Start
) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    # A history limit far above what a minute makes: only the TTL deletes members.
    # Members that crash at once: the pool's back-off counts them, so they stay.
    crash = ["sh", "-c", "exit 3"]
    cluster.create_pool("crash", 1, history=100, command=crash, ttlSecondsAfterFinished=1)
    # Members that end at their deadline (Stopped, DeadlineExceeded), then go at TTL.
    cluster.create_pool("brief", 1, history=100, activeDeadlineSeconds=5, ttlSecondsAfterFinished=2)

    def finished(pool: str) -> list[str]:
        return [m["metadata"]["name"] for m in cluster.members(pool) if phase(m) in TERMINAL]

    crashed = wait_for(lambda: finished("crash"), timeout=60, what="a member of pool crash to fail")
    first = wait_for(lambda: finished("brief"), timeout=60, what="a member of pool brief to end")[0]
    wait_for(
        lambda: first not in {m["metadata"]["name"] for m in cluster.members("brief")},
        timeout=60,
        what=f"finished member {first} deleted after its TTL",
    )
    left = set(finished("crash"))
    assert set(crashed) <= left, f"failed members {crashed} kept for the back-off; left {left}"
