"""The start-up sweep: tear down orphans and fenced containers, keep the rest.

It runs before the node heartbeats, so its cost is the node's time out of
service; it is bounded by one listing deadline plus the teardown pool's worst
case (``ceil(wedged / concurrency)`` teardown bounds), whatever the shims do.
The decision per container is pure (``sandlot.policy.agentsweep``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandlot.adapters.runtime import ContainerInfo, Runtime, TaskInfo, TaskState
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.teardown import Release, TeardownResult, teardown_many
from sandlot.api.common import key_of
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.agentsweep import (
    ContainerView,
    SandboxView,
    SweepAction,
    SweepDecision,
    classify,
    lost_sandboxes,
)

log = logging.getLogger(__name__)


def sandbox_view(obj: Mapping[str, Any]) -> SandboxView:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return SandboxView(
        key=key_of(obj),
        node_name=spec.get("nodeName"),
        phase=SandboxPhase(status.get("phase") or SandboxPhase.PENDING),
        container_id=status.get("containerID") or status.get("containerId"),
    )


@dataclass
class SweepReport:
    decisions: list[SweepDecision] = field(default_factory=list)
    teardowns: list[TeardownResult] = field(default_factory=list)
    adopted: dict[str, str] = field(default_factory=dict)
    """Sandbox key -> container id of the containers kept."""
    lost: list[SandboxView] = field(default_factory=list)
    """Running sandboxes of this node whose container is gone."""
    elapsed: float = 0.0

    def count(self, action: SweepAction) -> int:
        return sum(1 for d in self.decisions if d.action is action)


def sweep_orphans(
    runtime: Runtime,
    containers: Iterable[ContainerInfo],
    sandboxes: Iterable[Mapping[str, Any]],
    node_name: str,
    *,
    kill_wait: float,
    call_timeout: float,
    concurrency: int,
    metrics: AgentMetrics | None = None,
    release: Release | None = None,
) -> SweepReport:
    """Classify every container and tear down the orphans and fenced ones, concurrently.

    ``release`` frees each one's network (CNI DEL, namespace) from its labels alone,
    so the addresses of containers left by a crashed agent are released too.
    """
    began = time.monotonic()
    containers = list(containers)
    views = [sandbox_view(s) for s in sandboxes]
    decisions = classify([ContainerView(c.id, c.labels) for c in containers], views, node_name)
    by_id = {c.id: c for c in containers}
    doomed = [d for d in decisions if d.action is not SweepAction.ADOPT]
    for d in doomed:
        log.info(
            "sweep: container %s is %s (%s): tearing it down", d.container_id, d.action, d.reason
        )

    def done(result: TeardownResult) -> None:
        if metrics is not None:
            metrics.teardowns.labels(result.outcome.value).inc()

    results = teardown_many(
        runtime,
        [by_id[d.container_id] for d in doomed],
        kill_wait=kill_wait,
        call_timeout=call_timeout,
        concurrency=concurrency,
        on_done=done,
        release=release,
    )
    if metrics is not None:
        metrics.orphans_removed.inc(sum(1 for d in doomed if d.action is SweepAction.ORPHAN))
        metrics.fenced.inc(sum(1 for d in doomed if d.action is SweepAction.FENCE))
    report = SweepReport(decisions=decisions, teardowns=results)
    report.lost = lost_sandboxes(decisions, views, node_name)
    report.elapsed = time.monotonic() - began
    log.info(
        "sweep: %d containers, %d orphans and %d fenced torn down in %.2fs",
        len(decisions),
        report.count(SweepAction.ORPHAN),
        report.count(SweepAction.FENCE),
        report.elapsed,
    )
    return report


def readopt(
    report: SweepReport,
    tasks: Iterable[TaskInfo],
    *,
    metrics: AgentMetrics | None = None,
) -> dict[str, str]:
    """Keep the containers of Running sandboxes, untouched; returns sandbox key -> container.

    A kept container whose task has exited is left to the reaper, which ends its
    Sandbox with the exit code; one with a task in any other state (even UNKNOWN,
    a shim that is not answering) is never touched here.
    """
    states = {t.container_id: t for t in tasks}
    for d in report.decisions:
        if d.action is not SweepAction.ADOPT or d.sandbox_key is None:
            continue
        report.adopted[d.sandbox_key] = d.container_id
        task = states.get(d.container_id)
        state = task.state if task else "no task"
        log.info(
            "re-adopted container %s of sandbox %s (task %s, pid %s)",
            d.container_id,
            d.sandbox_key,
            state,
            task.pid if task else "-",
        )
        if task is None or task.state == TaskState.STOPPED:
            log.info("container %s has no running task: the reaper will end it", d.container_id)
    if metrics is not None:
        metrics.readopted.inc(len(report.adopted))
    return report.adopted
