"""The agent's parts that work on containerd, built once it answers.

Each part is handed the connected runtime itself: nothing holds a callable that
looks the runtime up later, and no part exists that could run before containerd
does. The image pulls are always among them (they talk to the same containerd).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from prometheus_client import CollectorRegistry

from sandlot.adapters.filetool import place_executor, place_files_tool
from sandlot.adapters.nodeguard import bounding_capabilities, swap_accounted
from sandlot.adapters.objects import Objects
from sandlot.adapters.runtime import Runtime
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.agent.capacity import node_capacity, node_security
from sandlot.agent.diskpressure import DiskPressure
from sandlot.agent.environment import Environment, node_brokered_data
from sandlot.agent.ephemeralstorage import EphemeralStorage
from sandlot.agent.idle import IdlePauses, post_sandbox_event
from sandlot.agent.logs import SandboxLogs, sandbox_logs
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.network import Networking
from sandlot.agent.pulling import ImageGate, build_image_gate
from sandlot.agent.reaper import Reaper
from sandlot.agent.runtimes import discover
from sandlot.agent.sandboxes import NodeFacts, SandboxWork
from sandlot.agent.settings import AgentSettings
from sandlot.agent.starts import Starts
from sandlot.agent.status import NodeSandboxCount, StatusWriter
from sandlot.agent.stops import Stops
from sandlot.agent.sync import SandboxSync
from sandlot.agent.workpools import SandboxPools
from sandlot.policy.imagegc import DiskUsage
from sandlot.policy.ocispec import ALL_CAPABILITIES


@dataclass
class AgentWiring:
    """What the agent has before containerd answers, and the parts use."""

    settings: AgentSettings
    objects: Objects
    status: StatusWriter
    metrics: AgentMetrics
    registry: CollectorRegistry
    pool: SandboxPools
    sandbox_watch: WatchCache
    node_watch: WatchCache
    address: str
    touch_image: Callable[[str], None]
    clock: Callable[[], datetime]
    stop: threading.Event
    sync_wake: threading.Event
    disk_usages: Callable[[], Sequence[DiskUsage]]
    """containerd's root's filesystem, and the logs' where they are kept, now."""
    collect_images: Callable[[], object]
    """One image GC pass (disk pressure runs it before it evicts)."""
    containerd_version: str = ""
    """What containerd said it is, once it answered."""


@dataclass
class AgentParts:
    runtime: Runtime
    networking: Networking
    image_gate: ImageGate
    close_pulls: Callable[[], None]
    logs: SandboxLogs
    work: SandboxWork
    sync: SandboxSync
    reaper: Reaper
    storage: EphemeralStorage
    pressure: DiskPressure
    idle: IdlePauses

    def close(self) -> None:
        """What the parts hold beside the loops (the runtime's channel, the pulls)."""
        if self.logs.writer is not None:  # the tasks' output waits in their pipes
            self.logs.writer.stop()
        self.close_pulls()
        self.runtime.close()


def node_facts(settings: AgentSettings, address: str, containerd_version: str = "") -> NodeFacts:
    return NodeFacts(
        address=address,
        limit_swap=swap_accounted(settings.cgroup_root),
        # containerd and runc run with the node's bounding set, as does this agent
        # (a privileged pod): `privileged` grants exactly that set.
        node_capabilities=tuple(bounding_capabilities(ALL_CAPABILITIES)),
        security=node_security(),
        capacity=node_capacity(settings),
        runtimes=discover(
            settings.containerd_config,
            settings.runtimes_dir,
            containerd_version=containerd_version,
        ),
        containerd_version=containerd_version,
        files_tool=place_files_tool(settings.files_tool, settings.state_dir),
        executor=place_executor(settings.executor, settings.state_dir),
    )


def idle_pauses(w: AgentWiring, runtime: Runtime, call_timeout: float) -> IdlePauses:
    """Idle auto-pause over ``runtime``; its Events name this node as their source."""
    settings = w.settings
    return IdlePauses(
        runtime,
        settings.node_name,
        w.status,
        w.sandbox_watch.items,
        w.metrics,
        partial(post_sandbox_event, w.objects, settings.node_name),
        clock=w.clock,
        threshold_cores=settings.idle_cpu_cores,
        cgroup_root=settings.cgroup_root,
        cgroup_parent=settings.cgroup_parent,
        call_timeout=call_timeout,
        slots=w.pool,
        sandbox_of=w.sandbox_watch.get,
    )


def build_agent_parts(w: AgentWiring, runtime: Runtime) -> AgentParts:
    """The parts over ``runtime``, each handed only what it uses."""
    settings = w.settings
    call_timeout = settings.call_timeout.total_seconds()
    networking = Networking(settings, partial(runtime.list_containers, timeout=call_timeout))
    # The image step of a start: pulls, their status and back-off.
    image_gate, close_pulls = build_image_gate(
        settings, w.objects.api, w.status, w.sync_wake, w.registry, w.clock
    )
    # Every sandbox's output, read by one thread from the tasks' FIFOs (None: not kept).
    logs = sandbox_logs(settings, runtime, call_timeout, w.metrics, w.sandbox_watch)
    stops = Stops(settings, w.objects, runtime, networking, w.status, w.metrics, cancel=w.stop)
    starts = Starts(
        stops,
        node_facts(settings, w.address, w.containerd_version),
        w.touch_image,
        w.clock,
        image_gate=image_gate,
        log_writer=logs.writer,
        sandboxes=w.sandbox_watch.items,
        environment=Environment(
            node_brokered_data(w.objects.api, settings.namespace, settings.node_name)
        ),
    )
    work = SandboxWork(starts, stops)
    storage = EphemeralStorage(
        runtime, w.pool, work, settings.log_dir, interval=settings.log_interval.total_seconds()
    )
    pressure = DiskPressure(
        storage,
        w.disk_usages,
        settings.gc_high / 100,
        settings.gc_low / 100,
        w.collect_images,
        transition=settings.disk_pressure_transition.total_seconds(),
        on_change=w.sync_wake.set,
        publish=lambda disk: w.objects.patch_node_status(settings.node_name, {"disk": disk}),
    )
    sync = SandboxSync(
        settings.node_name,
        w.sandbox_watch,
        w.node_watch,
        runtime,
        w.pool,
        work,
        w.metrics,
        call_timeout,
        report_count=NodeSandboxCount(w.objects, settings.node_name).report,
        refusal=pressure.refusal,
    )
    reaper = Reaper(
        w.objects,
        runtime,
        w.pool,
        work,
        w.status,
        w.metrics,
        cgroup_root=settings.cgroup_root,
        call_timeout=call_timeout,
    )
    return AgentParts(
        runtime,
        networking,
        image_gate,
        close_pulls,
        logs,
        work,
        sync,
        reaper,
        storage,
        pressure,
        idle_pauses(w, runtime, call_timeout),
    )


__all__ = ["AgentParts", "AgentWiring", "build_agent_parts", "node_facts"]
