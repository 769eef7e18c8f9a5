"""The starts a node refuses, judged in ``plan_sync`` from the node's facts as plain
data (``policy.startrefusals``): over capacity by count, memory, CPU and RuntimeClass
overheads, a placement misfit, a RuntimeClass refused or unreadable, disk pressure."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import Action, ActionKind, SandboxState, plan_sync, startable
from sandlot.policy.capacity import Capacity, Recorded, capacity_labels, recorded_limits
from sandlot.policy.limits import DefaultLimits
from sandlot.policy.runtimeclass import RuntimeClassInfo
from sandlot.policy.startrefusals import StartFacts

NODE = "node-a"
GI = 2**30


def sandbox(
    name: str,
    phase: str = "Scheduled",
    *,
    memory: str = "",
    cpu: str = "",
    disk: str = "",
    created: str = "2026-01-01T12:00:00Z",
    **spec: Any,
) -> dict[str, Any]:
    pairs = (("memory", memory), ("cpu", cpu), ("ephemeralStorage", disk))
    limits = {k: v for k, v in pairs if v}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": name, "creationTimestamp": created},
        "spec": {"image": "i", "nodeName": NODE, "resources": {"limits": limits}, **spec},
        "status": {"phase": phase, **({"containerId": f"c-{name}"} if phase == "Running" else {})},
    }


def running(name: str, **kw: Any) -> dict[str, Any]:
    return sandbox(name, "Running", **kw)


def plan(
    bodies: list[dict[str, Any]], *, with_container: tuple[str, ...] = (), **facts: Any
) -> list[Action]:
    """The plan for these Sandboxes on a node with ``facts`` (capacity 10, no memory
    or CPU bound unless given); Running ones have their container."""
    states = [SandboxState.from_object(b) for b in bodies]
    keys = {s.key for s in states if s.phase == "Running"} | {f"ns/{n}" for n in with_container}
    containers = [ContainerView(f"c-{k}", {SANDBOX_LABEL: k}) for k in sorted(keys)]
    node_facts = StartFacts(
        NODE,
        facts.pop("capacity", Capacity(10)),
        {s.key: b for s, b in zip(states, bodies, strict=True)},
        **facts,
    )
    return plan_sync(states, containers, drained=False, in_flight=(), facts=node_facts)


def starts(actions: list[Action]) -> list[tuple[str, str, str]]:
    """(kind, key, reason) of the actions on sandboxes waiting to start."""
    return [
        (a.kind.value, a.key, a.reason)
        for a in actions
        if a.kind in (ActionKind.START, ActionKind.FAIL, ActionKind.HOLD)
    ]


START, FAIL, HOLD = "start", "fail", "hold"
OVER, MISFIT = SandboxReason.OVER_CAPACITY, SandboxReason.PLACEMENT_REFUSED
TAINTED = {"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}}
LABELLED = {"metadata": {"labels": {"zone": "a"}}}
HEAVY = RuntimeClassInfo("vm", "crun", overhead_memory=GI // 2, overhead_cpu_millis=500)

ROWS: dict[str, tuple[list[dict[str, Any]], dict[str, Any], list[tuple[str, str, str]]]] = {
    "a start that fits stays a start": (
        [running("a", memory="1Gi"), sandbox("b", memory="1Gi")],
        {"capacity": Capacity(2, 2 * GI, 2000)},
        [(START, "ns/b", "")],
    ),
    "over capacity by count": (
        [running("a"), sandbox("b")],
        {"capacity": Capacity(1)},
        [(FAIL, "ns/b", OVER)],
    ),
    "an unstarted sandbox with its container counts as started": (
        [sandbox("a"), sandbox("b")],
        {"capacity": Capacity(1), "with_container": ("a",)},
        [(FAIL, "ns/b", OVER)],
    ),
    "a finished sandbox does not count": (
        [sandbox("a", "Failed"), sandbox("b")],
        {"capacity": Capacity(1)},
        [(START, "ns/b", "")],
    ),
    "over capacity by memory, the oldest waiting admitted first": (
        [
            running("a", memory="1Gi"),
            sandbox("late", memory="1Gi", created="2026-01-01T12:00:02Z"),
            sandbox("early", memory="1Gi", created="2026-01-01T12:00:01Z"),
        ],
        {"capacity": Capacity(10, 2 * GI)},
        [(FAIL, "ns/late", OVER), (START, "ns/early", "")],
    ),
    "over capacity by memory through the default limit": (
        [running("a", memory="1Gi"), sandbox("b")],
        {"capacity": Capacity(10, GI + 1), "default_memory": "512Mi"},
        [(FAIL, "ns/b", OVER)],
    ),
    "over capacity by CPU": (
        [running("a", cpu="1500m"), sandbox("b", cpu="1")],
        {"capacity": Capacity(10, None, 2000)},
        [(FAIL, "ns/b", OVER)],
    ),
    "a RuntimeClass's overhead counts for the one waiting": (
        [running("a", memory="1Gi"), sandbox("b", memory="512Mi")],
        {"capacity": Capacity(10, 2 * GI - 1), "classes": {"ns/b": HEAVY}},
        [(FAIL, "ns/b", OVER)],
    ),
    "a RuntimeClass's overhead counts for the one running": (
        [running("a", cpu="1"), sandbox("b", cpu="1")],
        {"capacity": Capacity(10, None, 2000), "classes": {"ns/a": HEAVY}},
        [(FAIL, "ns/b", OVER)],
    ),
    "over capacity by ephemeral storage": (
        [running("a", disk="6Gi"), sandbox("b", disk="4Gi")],
        {"capacity": Capacity(10, None, None, 8 * GI)},
        [(FAIL, "ns/b", OVER)],
    ),
    "over capacity by ephemeral storage through the node's default": (
        [running("a", disk="6Gi"), sandbox("b")],
        {"capacity": Capacity(10, None, None, 8 * GI), "default_storage": "4Gi"},
        [(FAIL, "ns/b", OVER)],
    ),
    "no disk limit anywhere counts nothing": (
        [running("a", disk="6Gi"), sandbox("b")],
        {"capacity": Capacity(10, None, None, 8 * GI)},
        [(START, "ns/b", "")],
    ),
    "a started one counts the disk limit its container records": (
        [running("a"), sandbox("b", disk="4Gi")],
        {
            "capacity": Capacity(10, None, None, 8 * GI),
            "recorded": {"ns/a": Recorded(storage=5 * GI)},
        },
        [(FAIL, "ns/b", OVER)],
    ),
    "a started one counts the memory its container records, not today's default": (
        [running("a"), sandbox("b", memory="1Gi")],
        {
            "capacity": Capacity(10, 2 * GI),
            "default_memory": "256Mi",
            "recorded": {"ns/a": Recorded(memory=3 * GI // 2)},
        },
        [(FAIL, "ns/b", OVER)],
    ),
    "a waiting one counts its namespace's defaults": (
        [running("a", memory="1Gi"), sandbox("b")],
        {
            "capacity": Capacity(10, 2 * GI),
            "default_memory": "256Mi",
            "namespace_defaults": {"ns": DefaultLimits(memory="1536Mi")},
        },
        [(FAIL, "ns/b", OVER)],
    ),
    "another namespace's defaults do not count": (
        [running("a", memory="1Gi"), sandbox("b")],
        {
            "capacity": Capacity(10, 2 * GI),
            "default_memory": "256Mi",
            "namespace_defaults": {"other": DefaultLimits(memory="1536Mi")},
        },
        [(START, "ns/b", "")],
    ),
    "a taint it does not tolerate is a misfit": (
        [sandbox("b")],
        {"node_body": TAINTED},
        [(FAIL, "ns/b", MISFIT)],
    ),
    "a node selector the node's labels do not match is a misfit": (
        [sandbox("b", nodeSelector={"zone": "b"})],
        {"node_body": LABELLED},
        [(FAIL, "ns/b", MISFIT)],
    ),
    "its RuntimeClass's node selector is the scheduler's (the Node's labels)": (
        [sandbox("b")],
        {
            "node_body": LABELLED,
            "classes": {"ns/b": RuntimeClassInfo("vm", "crun", (("zone", "b"),))},
        },
        [(START, "ns/b", "")],
    ),
    "a matching node selector starts": (
        [sandbox("b", nodeSelector={"zone": "a"})],
        {"node_body": LABELLED},
        [(START, "ns/b", "")],
    ),
    "a misfit is not counted against the capacity": (
        [sandbox("b", created="2026-01-01T12:00:01Z", nodeSelector={"zone": "b"}), sandbox("c")],
        {"capacity": Capacity(1), "node_body": LABELLED},
        [(FAIL, "ns/b", MISFIT), (START, "ns/c", "")],
    ),
    "a refused RuntimeClass fails with its own reason before the misfit": (
        [sandbox("b")],
        {
            "node_body": TAINTED,
            "class_refused": {"ns/b": (SandboxReason.RUNTIME_HANDLER_UNKNOWN, "no gvisor here")},
        },
        [(FAIL, "ns/b", SandboxReason.RUNTIME_HANDLER_UNKNOWN)],
    ),
    "an unreadable RuntimeClass waits for the next pass": (
        [sandbox("b")],
        {"class_unreadable": {"ns/b"}},
        [],
    ),
    "an unreadable RuntimeClass waits even when the placement misfits": (
        [sandbox("b")],
        {"node_body": TAINTED, "class_unreadable": {"ns/b"}},
        [],
    ),
    "disk pressure holds a start that fits": (
        [running("a"), sandbox("b")],
        {"hold": "disk 91% used"},
        [(HOLD, "ns/b", SandboxReason.DISK_PRESSURE)],
    ),
    "disk pressure holds an unreadable class too": (
        [sandbox("b")],
        {"hold": "disk 91% used", "class_unreadable": {"ns/b"}},
        [(HOLD, "ns/b", SandboxReason.DISK_PRESSURE)],
    ),
    "a start over capacity fails even under disk pressure": (
        [running("a"), sandbox("b")],
        {"capacity": Capacity(1), "hold": "disk 91% used"},
        [(FAIL, "ns/b", OVER)],
    ),
    "a misfit fails even under disk pressure": (
        [sandbox("b")],
        {"node_body": TAINTED, "hold": "disk 91% used"},
        [(FAIL, "ns/b", MISFIT)],
    ),
}


@pytest.mark.parametrize("name", ROWS)
def test_the_node_facts_turn_starts_into_refusals(name: str) -> None:
    bodies, facts, expected = ROWS[name]
    assert starts(plan(bodies, **facts)) == expected


def test_a_refusal_carries_the_message_its_status_shows() -> None:
    [fail] = plan([running("a"), sandbox("b")], capacity=Capacity(1))
    assert fail.message == f"node {NODE} is full: 1 sandboxes run or start there (capacity 1)"
    [misfit] = plan([sandbox("b")], node_body=TAINTED)
    assert misfit.message.startswith(f"spec.nodeName is {NODE}, which this sandbox may not run")
    [hold] = plan([sandbox("b")], hold="disk 91% used")
    assert (hold.kind, hold.message) == (ActionKind.HOLD, "disk 91% used")


def test_other_actions_pass_through_the_judgement_unchanged() -> None:
    bodies = [running("a"), sandbox("b"), sandbox("gone", "Stopped")]
    states = [SandboxState.from_object(b) for b in bodies]
    containers = [
        ContainerView("c-ns/gone", {SANDBOX_LABEL: "ns/gone"}),
        ContainerView("c-ns/x", {SANDBOX_LABEL: "ns/x"}),
    ]
    facts = StartFacts(NODE, Capacity(0), {s.key: b for s, b in zip(states, bodies, strict=True)})
    bare = plan_sync(states, containers, drained=False, in_flight=())
    judged = plan_sync(states, containers, drained=False, in_flight=(), facts=facts)
    assert [a for a in judged if a.key != "ns/b"] == [a for a in bare if a.key != "ns/b"]
    assert [a.kind for a in judged if a.key == "ns/b"] == [ActionKind.FAIL]


def test_startable_names_the_starts_before_the_facts_judge_them() -> None:
    bodies = [running("a"), sandbox("b"), sandbox("c"), sandbox("d")]
    states = [SandboxState.from_object(b) for b in bodies]
    containers = [ContainerView("c-d", {SANDBOX_LABEL: "ns/d"})]
    assert startable(states, containers, drained=False, in_flight={"ns/c"}) == ["ns/b"]
    assert startable(states, containers, drained=True, in_flight=()) == []


def test_a_sandbox_whose_placement_cannot_be_read_is_refused_naming_why() -> None:
    bad = sandbox("b", tolerations=[{"operator": "Sideways"}])
    [fail] = plan([bad])
    assert (fail.kind, fail.reason) == (ActionKind.FAIL, MISFIT)
    assert fail.message.startswith("its placement cannot be read:")


def test_without_facts_every_start_stands() -> None:
    states = [SandboxState.from_object(sandbox("b"))]
    assert plan_sync(states, [], drained=False, in_flight=()) == [Action(ActionKind.START, "ns/b")]


def test_a_start_records_its_limits_on_its_container_for_the_passes_after() -> None:
    spec = SandboxSpec.model_validate(
        {"image": "i", "resources": {"limits": {"memory": "512Mi", "cpu": "250m"}}}
    )
    labels = capacity_labels(spec)
    assert recorded_limits(labels) == Recorded(memory=512 * 2**20, cpu_millis=250)
    assert recorded_limits({"sandlot.dev/memory-limit": "lots"}) == Recorded()
