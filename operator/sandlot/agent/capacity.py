"""What the agent probes of its node: its capacity (the settings', else the node's
memory), its kernel's security facts (AppArmor, version) and the taints of its
Kubernetes Node. What the sync refuses for them is ``policy.startrefusals``'s."""

from __future__ import annotations

import logging
import platform
from typing import Any

from sandlot.adapters.nodeguard import (
    apparmor_profiles,
    filesystem_bytes,
    kubernetes_node_taints,
    node_memory_bytes,
    user_namespaces_allowed,
)
from sandlot.agent.settings import AgentSettings
from sandlot.policy.capacity import Capacity, cpu_millis, storage_room
from sandlot.policy.nodesecurity import NodeSecurity
from sandlot.policy.nodetrust import CONDITION_TAINTS
from sandlot.policy.quantity import memory_bytes
from sandlot.policy.seccomp import kernel_version

log = logging.getLogger(__name__)


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
    return Capacity(settings.capacity, memory, cpus, node_storage(settings))


def node_storage(settings: AgentSettings) -> int | None:
    """Ephemeral storage: the setting, else the disk below image GC's high mark (the
    collector keeps images and everything else under it); None if neither is known."""
    if settings.capacity_ephemeral_storage:
        return memory_bytes(settings.capacity_ephemeral_storage)
    size = filesystem_bytes(settings.containerd_root)
    if size is None:
        log.warning(
            "cannot size the filesystem of %s: ephemeral storage not bounded",
            settings.containerd_root,
        )
        return None
    return storage_room(size, settings.gc_high)


def capacity_status(capacity: Capacity) -> dict[str, Any]:
    """``status.capacity`` of the SandboxNode."""
    status: dict[str, Any] = {"sandboxes": capacity.sandboxes}
    if capacity.memory is not None:
        status["memory"] = str(capacity.memory)
    if capacity.cpu_millis is not None:
        status["cpu"] = f"{capacity.cpu_millis}m"
    if capacity.storage is not None:
        status["ephemeralStorage"] = str(capacity.storage)
    return status


__all__ = [
    "capacity_status",
    "mirrored_taints",
    "node_capacity",
    "node_security",
    "node_storage",
]
