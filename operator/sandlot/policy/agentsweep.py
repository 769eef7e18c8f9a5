"""What the agent does with each container it finds at start-up: a pure decision.

Every container in the agent's containerd namespace is the agent's. Its
``sandlot.dev/sandbox`` label ("namespace/name") ties it to a Sandbox; the
decision is a function of that label, the Sandboxes bound to this node, and the
node's name, so it can be pinned down by a table without a runtime or an API.

- **adopt**: the Sandbox is ``Running`` on this node and this is its container:
  keep it, untouched (an agent restart must not churn running sandboxes).
- **fence**: the Sandbox was marked ``Dead`` (the operator gave the node up while
  the agent was away): tear the container down, never resurrect it.
- **orphan**: anything else - no label, no Sandbox, a terminal Sandbox, another
  node's Sandbox, a Sandbox whose recorded container is another one, or one that
  never got to ``Running`` (its start was cut short; it is started afresh).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.operatingmode import TaskState


class SweepAction(StrEnum):
    ADOPT = "adopt"
    FENCE = "fence"
    ORPHAN = "orphan"


@dataclass(frozen=True)
class SandboxView:
    """What the sweep reads of a Sandbox."""

    key: str  # "namespace/name"
    node_name: str | None
    phase: SandboxPhase
    container_id: str | None = None


@dataclass(frozen=True)
class ContainerView:
    id: str
    labels: Mapping[str, str]
    task: TaskState | None = None
    """Its task's state as the pass listed it; None: not read (or no task)."""


@dataclass(frozen=True)
class SweepDecision:
    container_id: str
    action: SweepAction
    reason: str
    sandbox_key: str | None = None


def classify_container(
    container: ContainerView, sandboxes: Mapping[str, SandboxView], node_name: str
) -> SweepDecision:
    key = container.labels.get(SANDBOX_LABEL)
    if not key:
        return SweepDecision(container.id, SweepAction.ORPHAN, f"no {SANDBOX_LABEL} label")
    sandbox = sandboxes.get(key)
    if sandbox is None:
        return SweepDecision(
            container.id, SweepAction.ORPHAN, f"no Sandbox {key} on node {node_name}", key
        )
    if sandbox.node_name != node_name:
        return SweepDecision(
            container.id,
            SweepAction.ORPHAN,
            f"Sandbox {key} is bound to node {sandbox.node_name}",
            key,
        )
    if sandbox.phase == SandboxPhase.DEAD:
        return SweepDecision(container.id, SweepAction.FENCE, f"Sandbox {key} is Dead", key)
    if sandbox.phase in (SandboxPhase.STOPPED, SandboxPhase.FAILED):
        return SweepDecision(
            container.id, SweepAction.ORPHAN, f"Sandbox {key} is {sandbox.phase}", key
        )
    if sandbox.phase != SandboxPhase.RUNNING:
        return SweepDecision(
            container.id,
            SweepAction.ORPHAN,
            f"Sandbox {key} is {sandbox.phase}: its start was interrupted",
            key,
        )
    if sandbox.container_id and sandbox.container_id != container.id:
        return SweepDecision(
            container.id,
            SweepAction.ORPHAN,
            f"Sandbox {key} runs container {sandbox.container_id}",
            key,
        )
    return SweepDecision(container.id, SweepAction.ADOPT, f"Sandbox {key} is Running", key)


def classify(
    containers: Iterable[ContainerView], sandboxes: Iterable[SandboxView], node_name: str
) -> list[SweepDecision]:
    by_key = {s.key: s for s in sandboxes}
    return [classify_container(c, by_key, node_name) for c in containers]


def lost_sandboxes(
    decisions: Iterable[SweepDecision], sandboxes: Iterable[SandboxView], node_name: str
) -> list[SandboxView]:
    """Sandboxes ``Running`` on this node with no container left to adopt."""
    adopted = {d.sandbox_key for d in decisions if d.action is SweepAction.ADOPT}
    return [
        s
        for s in sandboxes
        if s.node_name == node_name and s.phase == SandboxPhase.RUNNING and s.key not in adopted
    ]
