"""The agent's steps before its node says it is alive (SPEC section 4): reach
containerd, sweep orphans, re-adopt survivors, register the SandboxNode.

Reaching containerd and listing what to sweep are retried with a capped, doubling
backoff until they answer or the agent is asked to stop: a node whose containerd
or API server is not up yet waits (and says so) instead of crash-looping, and a
stop request ends the wait at once. The sweep itself is bounded (``sweep``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sandlot
from sandlot.adapters.nodeguard import limit_cgroup, node_memory_bytes, pid_max
from sandlot.adapters.objects import Objects
from sandlot.adapters.runtime import Runtime, RuntimeError_, TaskInfo
from sandlot.agent.capacity import capacity_status, mirrored_taints
from sandlot.agent.metrics import AgentMetrics, timed_runtime
from sandlot.agent.sandboxes import NodeFacts
from sandlot.agent.settings import AgentSettings
from sandlot.agent.sweep import SweepReport, readopt, sweep_orphans
from sandlot.agent.teardown import Release
from sandlot.api.timestamps import parse_time
from sandlot.policy.agentsweep import SweepAction
from sandlot.policy.backoff import capped_doubling
from sandlot.policy.limits import ParentLimits, parent_limits
from sandlot.policy.quantity import memory_bytes

log = logging.getLogger(__name__)

CONNECT_BACKOFF_START = 0.5
CONNECT_BACKOFF_CAP = 30.0


def limit_sandbox_parent(settings: AgentSettings) -> ParentLimits | None:
    """Give the parent cgroup of every sandbox its hard memory and pids limits (the
    node's minus the reserves); None, said loudly, when the cgroup filesystem
    cannot be written (mounted read-only) or the node cannot be read."""
    memory, pids = node_memory_bytes(), pid_max()
    if memory is None or pids is None:
        log.warning(
            "cannot limit %s: the node's memory or pid_max is unreadable", settings.cgroup_parent
        )
        return None
    limits = parent_limits(memory, memory_bytes(settings.cgroup_parent_memory_reserve), pids)
    try:
        limit_cgroup(
            settings.cgroup_root, settings.cgroup_parent, memory=limits.memory, pids=limits.pids
        )
    except OSError as exc:
        log.warning(
            "cannot limit the sandboxes' parent cgroup %s under %s: %s; only each "
            "sandbox's own limits hold",
            settings.cgroup_parent,
            settings.cgroup_root,
            exc,
        )
        return None
    log.info(
        "sandboxes' parent cgroup %s: at most %d bytes of memory and %d pids",
        settings.cgroup_parent,
        limits.memory,
        limits.pids,
    )
    return limits


class Backoff:
    """Waits that double from ``CONNECT_BACKOFF_START`` up to ``CONNECT_BACKOFF_CAP``,
    each cut short by ``stop``."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.waits = 0

    @property
    def delay(self) -> float:
        """The next wait's length."""
        return capped_doubling(self.waits + 1, CONNECT_BACKOFF_START, CONNECT_BACKOFF_CAP)

    def wait(self) -> None:
        delay = self.delay
        self.waits += 1
        self.stop.wait(delay)


def connect_containerd(
    factory: Callable[[], Runtime],
    settings: AgentSettings,
    metrics: AgentMetrics,
    stop: threading.Event,
) -> tuple[Runtime, str] | None:
    """The runtime (timed) and containerd's version once it answers; None on stop."""
    call_timeout = settings.call_timeout.total_seconds()
    backoff = Backoff(stop)
    attempt = 0
    while not stop.is_set():
        attempt += 1
        runtime = factory()
        try:
            version = runtime.version(timeout=call_timeout)
        except RuntimeError_ as exc:
            runtime.close()
            metrics.containerd_up.set(0)
            log.error(
                "containerd unreachable at %s (attempt %d): %s; retrying in %.1fs",
                settings.containerd_address,
                attempt,
                exc,
                backoff.delay,
            )
            backoff.wait()
            continue
        metrics.containerd_up.set(1)
        log.info(
            "connected to containerd %s at %s (namespace %s)",
            version,
            settings.containerd_address,
            settings.containerd_namespace,
        )
        return timed_runtime(runtime, metrics), version
    return None


def sweep_with_retry(
    rt: Runtime,
    objects: Objects,
    settings: AgentSettings,
    metrics: AgentMetrics,
    stop: threading.Event,
    release: Release,
) -> SweepReport | None:
    """List containers and this node's Sandboxes, then sweep; listings are retried."""
    call_timeout = settings.call_timeout.total_seconds()
    backoff = Backoff(stop)
    while not stop.is_set():
        try:
            containers = rt.list_containers(timeout=call_timeout)
            sandboxes = objects.list_node_sandboxes(settings.node_name)
        except Exception as exc:
            log.error("start-up sweep cannot list (retrying in %.1fs): %s", backoff.delay, exc)
            backoff.wait()
            continue
        return sweep_orphans(
            rt,
            containers,
            sandboxes,
            settings.node_name,
            kill_wait=settings.kill_wait.total_seconds(),
            call_timeout=call_timeout,
            concurrency=settings.teardown_concurrency,
            metrics=metrics,
            release=release,
        )
    return None


def readopt_survivors(
    rt: Runtime,
    report: SweepReport,
    metrics: AgentMetrics,
    call_timeout: float,
    end_lost: Callable[[str], None],
) -> None:
    """Keep the kept containers; end the Sandboxes whose container is gone."""
    tasks: list[TaskInfo] = []
    if any(d.action is SweepAction.ADOPT for d in report.decisions):
        # Only for the log: with a wedged shim on the node this listing is slow.
        try:
            tasks = rt.list_tasks(timeout=call_timeout)
        except RuntimeError_ as exc:
            log.warning("cannot list tasks for re-adoption: %s", exc)
    readopt(report, tasks, metrics=metrics)
    for lost in report.lost:
        end_lost(lost.key)


def registration(
    objects: Objects,
    settings: AgentSettings,
    facts: NodeFacts,
    address: str,
    containerd_version: str,
) -> dict[str, Any]:
    """The SandboxNode status the agent registers with: what the node offers and runs."""
    return {
        "capacity": capacity_status(facts.capacity),
        "runtimeHandlers": [{"name": name} for name in facts.runtimes.names],
        **mirrored_taints(objects.api, settings.node_name),
        "address": address,
        "agentVersion": sandlot.__version__,
        "containerdVersion": containerd_version,
    }


def restored_exhausted_until(objects: Objects, node: str) -> datetime | None:
    """The image collector's armed backoff, as the node's status last recorded it."""
    try:
        found = objects.get_node(node) or {}
    except Exception:
        return None
    gc = (found.get("status") or {}).get("gc") or {}
    return parse_time(gc.get("exhaustedUntil"))
