"""``sandlot purge`` against the real API server: what ``helm uninstall``'s hooks run.

Purge is cluster-wide, so each test starts from the worker's empty fleet (the
``fleet`` fixture wipes it) and leaves it empty. Live agents are stood in for by
renewed Leases; a test plays the agent's part by writing ``Stopped``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import AGENT_LEASE_LABEL, NODE_HEALTH_FINALIZER
from sandlot.cli.main import main
from sandlot.devtools.controlplane import ControlPlane
from tests.support.operator import Fleet, wipe_nodes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

FINALIZER = NODE_HEALTH_FINALIZER


def purge(plane: ControlPlane, lease_namespace: str, *args: str) -> int:
    return main(
        [
            "purge",
            *args,
            "--namespace",
            lease_namespace,
            "--progress-every",
            "1s",
            "--kubeconfig",
            str(plane.kubeconfig),
        ]
    )


def names(kube: client.ApiClient, plural: str) -> list[str]:
    objs: Any = client.CustomObjectsApi(kube)
    return [
        i["metadata"]["name"]
        for i in objs.list_cluster_custom_object(GROUP, VERSION, plural)["items"]
    ]


def with_finalizer(fleet: Fleet, node: str) -> None:
    fleet.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", node, {"metadata": {"finalizers": [FINALIZER]}}
    )


def pool(fleet: Fleet, name: str) -> None:
    fleet.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "sandboxpools",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxPool",
            "metadata": {"name": name},
            "spec": {"replicas": 2, "template": {"spec": {"image": "example.test/busybox:1"}}},
        },
    )


def cacheprune(fleet: Fleet, name: str, node: str) -> None:
    fleet.objs.create_cluster_custom_object(
        GROUP,
        VERSION,
        "cacheprunes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "CachePrune",
            "metadata": {"name": name},
            "spec": {"all": True, "nodes": [node]},
        },
    )


def snapshot(fleet: Fleet, name: str, sandbox: str) -> None:
    fleet.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "sandboxsnapshots",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxSnapshot",
            "metadata": {"name": name},
            "spec": {"sandboxName": sandbox},
        },
    )


def unscheduled_sandbox(fleet: Fleet, name: str) -> None:
    fleet.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"image": "example.test/busybox:1"},
        },
    )


def agent_leases(kube: client.ApiClient, namespace: str) -> list[str]:
    out = client.CoordinationV1Api(kube).list_namespaced_lease(
        namespace, label_selector=f"{AGENT_LEASE_LABEL}=true"
    )
    return [lease.metadata.name for lease in out.items if lease.metadata and lease.metadata.name]


WORKLOAD_KINDS = ("sandboxclaims", "sandboxpools", "sandboxes", "sandboxsnapshots", "cacheprunes")


def claim(fleet: Fleet, name: str, pool_name: str) -> None:
    fleet.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "sandboxclaims",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"poolName": pool_name},
        },
    )


@pytest.fixture(autouse=True)
def leave_the_fleet_empty(kube: client.ApiClient) -> Iterator[None]:
    """What a test's purge was meant to keep (or failed to remove) goes after it."""
    yield
    wipe_nodes(kube)


def test_workloads_then_nodes_leave_no_object_of_any_kind(
    fleet: Fleet,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    lease_namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    live, lost = fleet.node("live"), fleet.node("lost")
    for node in (live, lost):
        with_finalizer(fleet, node)
    agent = fleet.lease(live)
    pool(fleet, "web")
    claim(fleet, "mine", "web")
    fleet.sandbox("done", live, "Stopped")  # its agent already tore it down
    fleet.sandbox("stranded", lost, "Running")  # no agent left to wait for
    unscheduled_sandbox(fleet, "pending")
    snapshot(fleet, "taken", "done")
    cacheprune(fleet, f"{fleet.prefix}-prune", live)

    assert purge(control_plane, lease_namespace, "--workloads", "--yes", "--wait", "30s") == 0
    for plural in WORKLOAD_KINDS:
        assert names(kube, plural) == [], f"{plural} left after purge --workloads"
    for node in (live, lost):  # nodes stay for the agents, cordoned
        assert fleet.get_node(node)["spec"]["unschedulable"] is True
    out = capsys.readouterr().out
    assert (
        "cordoned 2 SandboxNodes" in out
        and "no SandboxPool, Sandbox, SandboxSnapshot or CachePrune left" in out
    )

    agent.stop()  # the DaemonSet is gone before the post-delete hook runs
    assert purge(control_plane, lease_namespace, "--nodes", "--yes", "--wait", "30s") == 0
    assert names(kube, "sandboxnodes") == []
    assert agent_leases(kube, lease_namespace) == []
    assert "no SandboxNode left; deleted 1 node Leases" in capsys.readouterr().out


def test_sandboxes_on_live_nodes_are_deleted_only_once_their_agent_stopped_them(
    fleet: Fleet,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    lease_namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = fleet.node("n1")
    fleet.lease(node)
    fleet.sandbox("run", node, "Running")
    result: list[int] = []
    worker = threading.Thread(
        target=lambda: result.append(
            purge(control_plane, lease_namespace, "--workloads", "--yes", "--wait", "30s")
        ),
        daemon=True,
    )
    printed: list[str] = []

    def said(text: str) -> bool:
        printed.append(capsys.readouterr().out)
        return text in "".join(printed)

    worker.start()
    try:
        # Cordoned, and the purge has looked and found the sandbox still running: only
        # now does its agent stop it (set earlier, the purge would never have waited).
        wait_for(
            lambda: said("1 sandboxes still being stopped by the agents of 1 live nodes"),
            timeout=15,
            what="purge to cordon n1 and wait for its agent",
        )
        assert fleet.get_node(node)["spec"].get("unschedulable") is True
        assert fleet.phase("run") == "Running"
        fleet.set_phase("run", "Stopped", reason="Drained")  # what the agent writes after teardown
        wait_for(lambda: not worker.is_alive(), timeout=20, what="purge to finish")
    finally:
        worker.join(timeout=35)
    assert result == [0]
    assert names(kube, "sandboxes") == []
    assert said("every sandbox on a live node is stopped")


def test_a_sandbox_its_agent_never_stops_times_out_named_and_is_kept(
    fleet: Fleet,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    lease_namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = fleet.node("n1")
    fleet.lease(node)
    fleet.sandbox("stuck", node, "Running")
    assert purge(control_plane, lease_namespace, "--workloads", "--yes", "--wait", "2s") == 1
    out = capsys.readouterr().out
    assert "timed out after 2s" in out and f"{fleet.namespace}/stuck" in out
    assert fleet.phase("stuck") == "Running", "a sandbox still running must not be deleted"


@pytest.mark.parametrize("what", ["--workloads", "--nodes"], ids=["workloads", "nodes"])
def test_purge_without_yes_refuses_and_deletes_nothing(
    fleet: Fleet,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    lease_namespace: str,
    capsys: pytest.CaptureFixture[str],
    what: str,
) -> None:
    node = fleet.node("n1")
    fleet.sandbox("keep", node, "Stopped")
    assert purge(control_plane, lease_namespace, what) == 2
    assert "add --yes to confirm" in capsys.readouterr().err
    assert names(kube, "sandboxnodes") == [node]
    assert names(kube, "sandboxes") == ["keep"]
    assert fleet.get_node(node)["spec"].get("unschedulable") is not True
