"""What the agent probes of its node once, and what the sync pass refuses for it:
its capacity (the settings', else the node's memory and CPU count; over it,
``policy.capacity``), its kernel's security facts (AppArmor, version), the taints
of its Kubernetes Node, and a hand-placed sandbox its taints or labels do not
admit (``policy.placement``)."""

from __future__ import annotations

import logging
import platform
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sandlot.adapters.nodeguard import (
    apparmor_profiles,
    kubernetes_node_taints,
    node_memory_bytes,
    user_namespaces_allowed,
)
from sandlot.agent.settings import AgentSettings
from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.policy.agentsync import UNSTARTED_PHASES, SandboxState
from sandlot.policy.capacity import Capacity, Usage, cpu_millis, over_capacity, usage_of
from sandlot.policy.nodesecurity import NodeSecurity
from sandlot.policy.placement import Placement, misfit, taints_of
from sandlot.policy.quantity import memory_bytes
from sandlot.policy.runtimeclass import RuntimeClassInfo, joined_placement
from sandlot.policy.seccomp import kernel_version

log = logging.getLogger(__name__)

CONDITION_TAINTS = "node.kubernetes.io/"


def node_security() -> NodeSecurity:
    return NodeSecurity(
        apparmor_profiles(), kernel_version(platform.release()), user_namespaces_allowed()
    )


def mirrored_taints(api: Any, node: str) -> dict[str, Any]:
    """``status.nodeTaints``: the Kubernetes Node's taints (a control-plane node's
    keeps sandboxes off it); nothing when that Node cannot be read. The node
    lifecycle's condition taints (``node.kubernetes.io/...``: not-ready, pressure)
    are left out: they are the kubelet's health, and sandlot judges a node's health
    by its agent's Lease."""
    taints = kubernetes_node_taints(api, node)
    if taints is None:
        log.info("node %s: Kubernetes Node not readable: its taints are not mirrored", node)
        return {}
    return {"nodeTaints": [t for t in taints if not t["key"].startswith(CONDITION_TAINTS)]}


def node_capacity(settings: AgentSettings) -> Capacity:
    """Memory defaults to the node's: it is incompressible, a sum of limits beyond it
    is an OOM waiting to happen. CPU is compressible and its limits are caps, not
    reservations (Kubernetes lets them exceed allocatable too), so the sum of CPU
    limits is bounded only when ``capacity_cpu`` says so."""
    memory = (
        memory_bytes(settings.capacity_memory) if settings.capacity_memory else node_memory_bytes()
    )
    cpus = cpu_millis(settings.capacity_cpu) if settings.capacity_cpu else None
    return Capacity(settings.capacity, memory, cpus)


def capacity_status(capacity: Capacity) -> dict[str, Any]:
    """``status.capacity`` of the SandboxNode."""
    status: dict[str, Any] = {"sandboxes": capacity.sandboxes}
    if capacity.memory is not None:
        status["memory"] = str(capacity.memory)
    if capacity.cpu_millis is not None:
        status["cpu"] = f"{capacity.cpu_millis}m"
    return status


def _usage(
    obj: Mapping[str, Any],
    key: str,
    settings: AgentSettings,
    runtime_class: RuntimeClassInfo | None = None,
) -> Usage:
    """Its limits (or the defaults), plus its RuntimeClass's overhead."""
    limits = ((obj.get("spec") or {}).get("resources") or {}).get("limits") or {}
    created = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    usage = usage_of(
        key,
        limits.get("memory") or settings.default_memory_limit,
        limits.get("cpu") or settings.default_cpu_limit,
        created,
    )
    if runtime_class is None:
        return usage
    return replace(
        usage,
        memory=usage.memory + runtime_class.overhead_memory,
        cpu_millis=usage.cpu_millis + runtime_class.overhead_cpu_millis,
    )


def refusals(
    node: str,
    bodies: Mapping[str, tuple[SandboxState, Mapping[str, Any]]],
    with_container: set[str],
    starting: Sequence[str],
    settings: AgentSettings,
    capacity: Capacity,
    classes: Mapping[str, RuntimeClassInfo] | None = None,
) -> dict[str, str]:
    """``{key: message}`` of the sandboxes about to start that do not fit.

    Counted as started: Running ones and unstarted ones with a container (a start
    under way). Each is counted with its own limits or the agent's defaults, and its
    RuntimeClass's overhead (``classes``, by key)."""
    classes = classes or {}
    started = [
        _usage(obj, key, settings, classes.get(key))
        for key, (state, obj) in bodies.items()
        if state.phase not in TERMINAL_PHASES
        and (state.phase not in UNSTARTED_PHASES or key in with_container)
        and key not in starting
    ]
    waiting = [
        _usage(bodies[key][1], key, settings, classes.get(key)) for key in starting if key in bodies
    ]
    return over_capacity(node, started, waiting, capacity)


def misplaced(
    node: str,
    node_body: Mapping[str, Any] | None,
    bodies: Mapping[str, tuple[SandboxState, Mapping[str, Any]]],
    starting: Sequence[str],
    classes: Mapping[str, RuntimeClassInfo] | None = None,
) -> dict[str, str]:
    """``{key: message}`` of the sandboxes about to start whose placement, joined with
    their RuntimeClass's (``classes``, by key), this node does not satisfy (a
    hand-set ``spec.nodeName`` skips the scheduler, not this)."""
    labels = dict(((node_body or {}).get("metadata") or {}).get("labels") or {})
    taints = taints_of(node_body or {})
    refused = {}
    for key in starting:
        if key not in bodies:
            continue
        try:
            placement = Placement.from_body(bodies[key][1].get("spec") or {})
        except ValueError as exc:
            refused[key] = f"its placement cannot be read: {exc}"
            continue
        if classes and key in classes:
            placement = joined_placement(placement, classes[key])
        why = misfit(placement, labels, taints)
        if why is not None:
            refused[key] = f"spec.nodeName is {node}, which this sandbox may not run on: {why}"
    return refused


__all__ = [
    "capacity_status",
    "mirrored_taints",
    "misplaced",
    "node_capacity",
    "node_security",
    "refusals",
]
