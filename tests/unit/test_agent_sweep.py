"""The start-up sweep's decision per container, as a table; then the sweep itself
over an in-memory runtime."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.sweep import readopt, sweep_orphans
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.agentsweep import (
    ContainerView,
    SandboxView,
    SweepAction,
    classify,
    classify_container,
    lost_sandboxes,
)
from tests.support.agent import FakeRuntime

NODE = "n1"


def _sb(phase: str, node: str | None = NODE, container: str | None = "c1") -> SandboxView:
    return SandboxView("ns/a", node, SandboxPhase(phase), container)


CASES = [
    # (container labels, sandbox or None, expected action, words in the reason)
    ({}, None, SweepAction.ORPHAN, "no sandlot.dev/sandbox label"),
    ({SANDBOX_LABEL: "ns/a"}, None, SweepAction.ORPHAN, "no Sandbox ns/a"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Running", node="n2"), SweepAction.ORPHAN, "node n2"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Stopped"), SweepAction.ORPHAN, "Stopped"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Failed"), SweepAction.ORPHAN, "Failed"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Dead"), SweepAction.FENCE, "Dead"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Scheduled", container=None), SweepAction.ORPHAN, "interrupted"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Running", container="other"), SweepAction.ORPHAN, "other"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Running"), SweepAction.ADOPT, "Running"),
    ({SANDBOX_LABEL: "ns/a"}, _sb("Running", container=None), SweepAction.ADOPT, "Running"),
]


@pytest.mark.parametrize(
    ("labels", "sandbox", "action", "reason"),
    CASES,
    ids=[
        "unlabelled-is-orphan",
        "no-sandbox-is-orphan",
        "other-nodes-sandbox-is-orphan",
        "stopped-sandbox-is-orphan",
        "failed-sandbox-is-orphan",
        "dead-sandbox-is-fenced",
        "interrupted-start-is-orphan",
        "running-with-another-container-is-orphan",
        "running-on-this-node-is-adopted",
        "running-without-recorded-container-is-adopted",
    ],
)
def test_classification(labels, sandbox, action, reason) -> None:
    sandboxes = {sandbox.key: sandbox} if sandbox else {}
    decision = classify_container(ContainerView("c1", labels), sandboxes, NODE)
    assert decision.action is action
    assert reason in decision.reason


def test_running_sandbox_without_container_is_lost() -> None:
    running = SandboxPhase.RUNNING
    sandboxes = [SandboxView("ns/a", NODE, running, "c1"), SandboxView("ns/b", NODE, running)]
    decisions = classify([ContainerView("c1", {SANDBOX_LABEL: "ns/a"})], sandboxes, NODE)
    assert [s.key for s in lost_sandboxes(decisions, sandboxes, NODE)] == ["ns/b"]


def _obj(name: str, phase: str, node: str = NODE, container: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"nodeName": node, "image": "img"},
        "status": {"phase": phase, "containerId": container},
    }


def test_sweep_tears_down_orphans_and_fenced_and_keeps_running() -> None:
    rt = FakeRuntime()
    rt.add("keep", {SANDBOX_LABEL: "ns/run"})
    rt.add("orphan", {SANDBOX_LABEL: "ns/gone"})
    rt.add("fenced", {SANDBOX_LABEL: "ns/dead"})
    rt.add("done", {SANDBOX_LABEL: "ns/stopped"}, state=None)
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    report = sweep_orphans(
        rt,
        rt.list_containers(timeout=1),
        [
            _obj("run", "Running", container="keep"),
            _obj("dead", "Dead", container="fenced"),
            _obj("stopped", "Stopped"),
        ],
        NODE,
        kill_wait=0.2,
        call_timeout=0.2,
        concurrency=4,
        metrics=metrics,
    )
    assert set(rt.containers) == {"keep"}
    assert rt.snapshots == {"keep"}
    assert ("kill_task", "keep") not in rt.calls  # an adopted container is never touched
    assert readopt(report, rt.list_tasks(timeout=1), metrics=metrics) == {"ns/run": "keep"}
    value = registry.get_sample_value
    assert value("sandlot_agent_orphans_removed_total") == 2
    assert value("sandlot_agent_fenced_total") == 1
    assert value("sandlot_agent_readopted_total") == 1
    assert value("sandlot_agent_teardowns_total", {"outcome": "clean"}) == 3
