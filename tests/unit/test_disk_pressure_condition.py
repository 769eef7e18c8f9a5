"""Node disk pressure seen by the operator: the ``DiskPressure`` condition mirrored
from ``status.disk``, and the scheduler placing nothing on a node where it is True."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.common import Condition
from sandlot.api.node import NodePhase
from sandlot.api.reasons import ConditionType, NodeReason
from sandlot.controllers.noderead import NodeRead
from sandlot.policy.nodeconditions import disk_conditions
from sandlot.policy.scheduling import NodeSlot, SandboxRequest, Unschedulable, choose_node

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
READY = Condition(type="Ready", status="True", reason="LeaseRenewed", message="m")


def disk_of(conditions: tuple[Condition, ...] | None) -> Condition | None:
    return next((c for c in conditions or () if c.type == ConditionType.DISK_PRESSURE), None)


@pytest.mark.parametrize(
    ("pressure", "status", "reason"),
    [
        (True, "True", NodeReason.AGENT_HAS_DISK_PRESSURE),
        (False, "False", NodeReason.AGENT_HAS_NO_DISK_PRESSURE),
    ],
    ids=["pressure_sets_it_true", "no_pressure_sets_it_false"],
)
def test_the_condition_mirrors_status_disk(pressure: bool, status: str, reason: str) -> None:
    updated = disk_conditions(pressure, "95% full", (READY,), NOW)
    assert updated is not None and updated[0] == READY  # the others kept, in place
    disk = disk_of(updated)
    assert disk is not None
    assert (disk.status, disk.reason, disk.last_transition_time) == (status, reason, NOW)
    if pressure:
        assert disk.message == "95% full"


def test_nothing_is_said_before_the_agent_wrote_status_disk() -> None:
    assert disk_conditions(None, "", (READY,), NOW) is None


def test_unchanged_is_none_and_the_transition_time_moves_only_with_the_status() -> None:
    on = disk_conditions(True, "95% full", (), NOW)
    assert on is not None
    assert disk_conditions(True, "95% full", on, LATER) is None
    off = disk_conditions(False, "", on, LATER)
    assert off is not None
    disk = disk_of(off)
    assert disk is not None and (disk.status, disk.last_transition_time) == ("False", LATER)
    assert disk_conditions(False, "", off, LATER + timedelta(minutes=1)) is None


def body(
    disk: dict[str, Any] | None, conditions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Ready", "conditions": conditions or []}
    if disk is not None:
        status["disk"] = disk
    return {"metadata": {"name": "n1"}, "status": status}


def test_the_controller_adds_the_condition_to_its_patch_or_writes_it_alone() -> None:
    read = NodeRead.of(body({"pressure": True, "message": "95% full"}))
    alone = read.with_disk(None, NOW)
    assert alone is not None and set(alone) == {"conditions"}
    assert [(c["type"], c["status"]) for c in alone["conditions"]] == [("DiskPressure", "True")]
    ready = {"phase": "Ready", "conditions": [READY.wire()]}
    merged = read.with_disk(ready, NOW)
    assert merged is not None and merged["phase"] == "Ready"
    assert [c["type"] for c in merged["conditions"]] == ["Ready", "DiskPressure"]
    settled = NodeRead.of(body({"pressure": True, "message": "95% full"}, alone["conditions"]))
    assert settled.with_disk(None, LATER) is None  # nothing to write on a routine pass
    assert NodeRead.of(body(None)).with_disk(None, NOW) is None


def slot(name: str, *, pressure: bool = False, load: int = 0, capacity: int = 10) -> NodeSlot:
    return NodeSlot(
        name=name,
        phase=NodePhase.READY,
        unschedulable=False,
        capacity=capacity,
        sandboxes=load,
        disk_pressure=pressure,
    )


@pytest.mark.parametrize(
    ("nodes", "node", "reason", "message"),
    [
        ([slot("a", pressure=True), slot("b", load=9)], "b", None, ""),
        (
            [slot("a", pressure=True), slot("b", pressure=True)],
            None,
            Unschedulable.DISK_PRESSURE,
            "0/2 nodes are available: 2 under disk pressure",
        ),
        (
            [slot("a", pressure=True), slot("b", capacity=1, load=1)],
            None,
            Unschedulable.ALL_AT_CAPACITY,
            "0/2 nodes are available: 1 under disk pressure, 1 at capacity",
        ),
    ],
    ids=[
        "the_emptier_node_under_pressure_is_passed_over",
        "every_node_under_pressure_says_so",
        "pressure_and_capacity_each_named",
    ],
)
def test_nothing_is_placed_on_a_node_under_disk_pressure(
    nodes: list[NodeSlot], node: str | None, reason: Unschedulable | None, message: str
) -> None:
    choice = choose_node(SandboxRequest("ns/sb"), nodes, NOW)
    assert (choice.node, choice.reason, choice.message) == (node, reason, message)
