"""The scheduler honours taints and tolerations and node selectors, claimed with a
real ``sandlot operator`` against the real API server: a control-plane-tainted
SandboxNode gets no sandbox unless it tolerates the taint, and a node selector
narrows the choice to the nodes it names; a RuntimeClass sends its sandboxes only
to nodes offering its handler, with its scheduling joined to theirs."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from sandlot.api import GROUP, VERSION
from sandlot.api.keys import TAINTED_LABEL
from sandlot.api.placement import CONTROL_PLANE_TAINT
from tests.support.operator import Fleet, OperatorProcess
from tests.support.runtimeclasses import runtime_class
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

# The admins' Node label confirming runtime handlers (api.keys.RUNTIME_HANDLERS_LABEL),
# spelled out: what the chart's users type.
RUNTIME_HANDLERS_LABEL = f"{GROUP}/runtime-handlers"


def _ready_node(
    fleet: Fleet,
    name: str,
    *,
    labels: dict[str, str],
    taints: list[dict[str, Any]],
    handlers: tuple[str, ...] = ("runc",),
) -> str:
    node = fleet.node(name)
    fleet.objs.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "sandboxnodes",
        node,
        {"metadata": {"labels": labels}, "spec": {"taints": taints}},
    )
    fleet.objs.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sandboxnodes",
        node,
        {
            "status": {
                "capacity": {"sandboxes": 10},
                "runtimeHandlers": [{"name": h} for h in handlers],
            }
        },
    )
    fleet.lease(node, duration=30)
    return node


@pytest.fixture
def kube_nodes(kube: client.ApiClient) -> Iterator[Callable[..., None]]:
    """Creates Kubernetes Nodes (no agent writes them); deleted after the test."""
    core: Any = client.CoreV1Api(kube)
    made: list[str] = []

    def make(name: str, *, labels: dict[str, str], taints: list[dict[str, Any]]) -> None:
        core.create_node({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}})
        made.append(name)

    yield make
    for name in made:
        core.delete_node(name)


def _pending(fleet: Fleet, name: str, **spec: Any) -> None:
    fleet.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"image": "example.test/busybox:1", **spec},
        },
    )


def _waiting_message(fleet: Fleet, name: str, reason: str) -> str:
    def waiting() -> str | None:
        conditions = (fleet.get(name).get("status") or {}).get("conditions") or []
        return next((c.get("message", "") for c in conditions if c.get("reason") == reason), None)

    return wait_for(waiting, timeout=30, what=f"sandbox {name} to wait with reason {reason}")


def _bound(fleet: Fleet, name: str) -> str:
    node: str = wait_for(
        lambda: (fleet.get(name).get("spec") or {}).get("nodeName"),
        timeout=30,
        what=f"sandbox {name} to be bound",
    )
    return node


def test_scheduler_honours_taints_tolerations_and_node_selectors(
    kube: client.ApiClient, fleet: Fleet, operators: Callable[..., OperatorProcess]
) -> None:
    taint = {"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}
    cp = _ready_node(fleet, "cp", labels={"role": "control-plane"}, taints=[taint])
    worker = _ready_node(fleet, "worker", labels={"role": "worker"}, taints=[])
    operators("--resync-interval", "1s")

    for i in range(3):
        _pending(fleet, f"plain-{i}")
    assert {_bound(fleet, f"plain-{i}") for i in range(3)} == {worker}

    tolerations = [{"key": CONTROL_PLANE_TAINT, "operator": "Exists"}]
    _pending(fleet, "on-cp", tolerations=tolerations, nodeSelector={"role": "control-plane"})
    assert _bound(fleet, "on-cp") == cp

    _pending(fleet, "nowhere", nodeSelector={"role": "gpu"})

    def waiting() -> str | None:
        sb = fleet.get("nowhere")
        conditions = (sb.get("status") or {}).get("conditions") or []
        messages = [c.get("message", "") for c in conditions]
        return next((m for m in messages if "nodes are available" in m), None)

    message = wait_for(waiting, timeout=30, what="the unplaceable sandbox to say why")
    assert "2 untolerated taint or node selector/affinity mismatch" in message, message
    assert not (fleet.get("nowhere").get("spec") or {}).get("nodeName")


def test_operator_labels_the_nodes_with_blocking_taints_for_the_admission_policy(
    kube: client.ApiClient, fleet: Fleet, operators: Callable[..., OperatorProcess]
) -> None:
    taint = {"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}
    cp = _ready_node(fleet, "cp", labels={}, taints=[taint])
    soft = _ready_node(
        fleet, "soft", labels={}, taints=[{"key": "spot", "effect": "PreferNoSchedule"}]
    )
    mirrored = _ready_node(fleet, "mirrored", labels={}, taints=[])
    fleet.objs.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", mirrored, {"status": {"nodeTaints": [taint]}}
    )
    operators("--resync-interval", "1s")

    def labelled() -> set[str]:
        return {
            name
            for name in (cp, soft, mirrored)
            if (fleet.get_node(name)["metadata"].get("labels") or {}).get(TAINTED_LABEL) == "true"
        }

    wait_for(lambda: labelled() == {cp, mirrored}, timeout=30, what="tainted nodes labelled")
    # No Kubernetes Node of that name: the mirror is all there is, copied for the policy.
    copied = fleet.get_node(mirrored)["status"].get("trustedNodeTaints")
    assert copied == [{**taint, "value": ""}], copied
    fleet.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", cp, {"spec": {"taints": []}}
    )
    wait_for(lambda: labelled() == {mirrored}, timeout=30, what="the untainted node's label gone")
    assert TAINTED_LABEL not in (fleet.get_node(cp)["metadata"].get("labels") or {})


def test_a_new_leader_labels_a_node_tainted_while_it_stood_by(
    kube: client.ApiClient, fleet: Fleet, operators: Callable[..., OperatorProcess]
) -> None:
    """The taint arrives while the leader is frozen and the standby may not write: the
    standby's event handler passes it by, and after the takeover no new event comes.
    Only the node resync timer, the one timer per node, can label it."""
    node = _ready_node(fleet, "late", labels={}, taints=[])
    a, b = operators("--resync-interval", "1s"), operators("--resync-interval", "1s")
    leader = wait_for(
        lambda: next((o for o in (a, b) if o.is_leader()), None),
        timeout=20,
        what="one operator to lead",
    )
    standby = b if leader is a else a
    wait_for(
        lambda: fleet.get_node(node).get("status", {}).get("phase") == "Ready",
        timeout=15,
        what="node Ready",
    )
    os.kill(leader.proc.pid, signal.SIGSTOP)  # frozen: its events wait unread
    try:
        taint = {"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}
        fleet.objs.patch_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", node, {"spec": {"taints": [taint]}}
        )
    finally:
        leader.kill()
    wait_for(standby.is_leader, timeout=30, what="the standby to take over")
    wait_for(
        lambda: (fleet.get_node(node)["metadata"].get("labels") or {}).get(TAINTED_LABEL) == "true",
        timeout=20,
        what="the node tainted before the takeover labelled by the new leader",
    )


def test_scheduler_places_a_runtime_class_only_on_nodes_with_its_handler(
    kube: client.ApiClient,
    fleet: Fleet,
    operators: Callable[..., OperatorProcess],
    kube_nodes: Callable[..., None],
) -> None:
    taint = {"key": "sandlot.test/crun", "effect": "NoSchedule"}
    plain = _ready_node(fleet, "plain", labels={"runtime": "plain"}, taints=[])
    other = _ready_node(fleet, "other", labels={"runtime": "crun"}, taints=[])
    crun = _ready_node(
        fleet, "crun", labels={"runtime": "crun"}, taints=[taint], handlers=("runc", "crun")
    )
    # The class's selector matched against the Kubernetes Nodes' labels confirms crun.
    for node, runtime in ((plain, "plain"), (other, "crun"), (crun, "crun")):
        kube_nodes(node, labels={"runtime": runtime}, taints=[])
    scheduling = {
        "nodeSelector": {"runtime": "crun"},
        "tolerations": [{"key": "sandlot.test/crun", "operator": "Exists"}],
    }
    operators("--resync-interval", "1s")
    with (
        runtime_class(kube, "crun", scheduling=scheduling) as crun_class,
        runtime_class(kube, "gvisor") as absent_handler,
    ):
        # Only the tainted node has crun: the class's toleration lets them on, its
        # selector and the handler keep them off the two others.
        for i in range(3):
            _pending(fleet, f"fast-{i}", runtimeClassName=crun_class)
        assert {_bound(fleet, f"fast-{i}") for i in range(3)} == {crun}
        for i in range(2):
            _pending(fleet, f"plain-{i}")
        assert {_bound(fleet, f"plain-{i}") for i in range(2)} <= {plain, other}

        _pending(fleet, "nowhere", runtimeClassName=absent_handler)
        message = _waiting_message(fleet, "nowhere", "Unschedulable")
        assert '3 no runtime handler "gvisor"' in message, message
        _pending(fleet, "classless", runtimeClassName="no-such-class")
        message = _waiting_message(fleet, "classless", "RuntimeClassNotFound")
        assert "no-such-class" in message, message
    for name in ("nowhere", "classless"):
        assert not (fleet.get(name).get("spec") or {}).get("nodeName")


def _disk_condition(fleet: Fleet, node: str) -> dict[str, Any] | None:
    conditions = (fleet.get_node(node).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "DiskPressure"), None)


def _set_disk(fleet: Fleet, node: str, disk: dict[str, Any]) -> None:
    fleet.objs.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", node, {"status": {"disk": disk}}
    )


def test_a_node_under_disk_pressure_gets_the_condition_and_no_new_sandbox(
    kube: client.ApiClient, fleet: Fleet, operators: Callable[..., OperatorProcess]
) -> None:
    # "a-..." comes first by name: with equal load, only the pressure keeps sandboxes off it
    pressed = _ready_node(fleet, "a-pressed", labels={}, taints=[])
    free = _ready_node(fleet, "b-free", labels={}, taints=[])
    _set_disk(
        fleet,
        pressed,
        {
            "pressure": True,
            "since": "2026-01-01T12:00:00Z",
            "usagePercent": 91.0,
            "message": "the node is under disk pressure: its disk was 91% full",
        },
    )
    _set_disk(fleet, free, {"pressure": False, "since": None, "message": ""})
    operators("--resync-interval", "1s")

    def condition_is(node: str, status: str) -> dict[str, Any] | None:
        found = _disk_condition(fleet, node)
        return found if found is not None and found.get("status") == status else None

    on = wait_for(lambda: condition_is(pressed, "True"), timeout=30, what="DiskPressure True")
    assert on["reason"] == "AgentHasDiskPressure" and "91% full" in on["message"], on
    wait_for(lambda: condition_is(free, "False"), timeout=30, what="DiskPressure False on b-free")

    for i in range(3):
        _pending(fleet, f"new-{i}")
    assert {_bound(fleet, f"new-{i}") for i in range(3)} == {free}

    fleet.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", free, {"spec": {"unschedulable": True}}
    )
    wait_for(
        lambda: fleet.get_node(free).get("status", {}).get("phase") == "Disabled",
        timeout=30,
        what="b-free Disabled",
    )
    _pending(fleet, "waits")
    message = _waiting_message(fleet, "waits", "Unschedulable")
    assert "1 under disk pressure" in message and "1 Disabled" in message, message
    assert not (fleet.get("waits").get("spec") or {}).get("nodeName")

    _set_disk(fleet, pressed, {"pressure": False, "since": None, "message": ""})
    off = wait_for(lambda: condition_is(pressed, "False"), timeout=30, what="DiskPressure False")
    assert off["reason"] == "AgentHasNoDiskPressure", off
    assert _bound(fleet, "waits") == pressed  # the pressure over, the waiting sandbox placed


def test_a_node_cannot_clear_its_taints_or_claim_a_handler_to_draw_sandboxes(
    kube: client.ApiClient,
    fleet: Fleet,
    operators: Callable[..., OperatorProcess],
    kube_nodes: Callable[..., None],
) -> None:
    """The wrong party is the node's agent: its SandboxNode's status mirrors no taint
    and offers gVisor, while its Kubernetes Node (no agent writes it) is tainted for
    another tenant and confirms no gVisor. First by name, it would win every tie."""
    tenant = {"key": "sandlot.test/tenant", "value": "b", "effect": "NoSchedule"}
    hostile = _ready_node(fleet, "a-hostile", labels={}, taints=[], handlers=("runc", "gvisor"))
    fleet.objs.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", hostile, {"status": {"nodeTaints": []}}
    )
    kube_nodes(hostile, labels={}, taints=[tenant])
    honest = _ready_node(fleet, "b-honest", labels={}, taints=[])
    kube_nodes(honest, labels={}, taints=[])
    operators("--resync-interval", "1s")

    for i in range(3):
        _pending(fleet, f"plain-{i}")
    assert {_bound(fleet, f"plain-{i}") for i in range(3)} == {honest}

    tolerations = [{"key": "sandlot.test/tenant", "operator": "Equal", "value": "b"}]
    _pending(fleet, "tenant-b", tolerations=tolerations)
    assert _bound(fleet, "tenant-b") == hostile, "the Node's own taint, tolerated, lets it on"

    with runtime_class(kube, "gvisor") as gvisor:
        _pending(fleet, "wants-gvisor", runtimeClassName=gvisor, tolerations=tolerations)
        message = _waiting_message(fleet, "wants-gvisor", "Unschedulable")
        assert '2 no runtime handler "gvisor"' in message, message
        assert not (fleet.get("wants-gvisor").get("spec") or {}).get("nodeName")
        # An admin confirms gVisor on the Node: now it goes there.
        client.CoreV1Api(kube).patch_node(
            hostile, {"metadata": {"labels": {RUNTIME_HANDLERS_LABEL: "gvisor"}}}
        )
        assert _bound(fleet, "wants-gvisor") == hostile
