"""The agent's parts that work on containerd, built once it answers.

Each part is handed the connected runtime itself: nothing holds a callable that
looks the runtime up later, and no part exists that could run before containerd
does. The image pulls are always among them (they talk to the same containerd).
Each is built with all it needs, in an order where what it needs already exists:
nothing is handed to a part after it was built. The stream server, the idle loop
and the sync meet through ``agent.uses``, which the agent builds before them.
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
from sandlot.adapters.pullsecrets import node_brokered_data
from sandlot.adapters.runtime import Runtime
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.agent.bringup import restored_exhausted_until
from sandlot.agent.cacheprune import CacheUpkeep
from sandlot.agent.capacity import node_capacity, node_security
from sandlot.agent.diskpressure import DiskPressure
from sandlot.agent.environment import Environment
from sandlot.agent.ephemeralstorage import EphemeralStorage
from sandlot.agent.idle import IdlePauses, post_sandbox_event
from sandlot.agent.imagegc import ImageCollector
from sandlot.agent.logs import SandboxLogs, sandbox_logs
from sandlot.agent.metrics import AgentMetrics, GcMetrics
from sandlot.agent.network import Networking
from sandlot.agent.pulling import ImageGate, build_image_gate
from sandlot.agent.reaper import Reaper
from sandlot.agent.runtimes import discover
from sandlot.agent.sandboxes import NodeFacts, SandboxWork
from sandlot.agent.settings import AgentSettings
from sandlot.agent.snapshots import Snapshots
from sandlot.agent.starts import Starts
from sandlot.agent.statestore import StateStore
from sandlot.agent.status import NodeSandboxCount, StatusWriter
from sandlot.agent.stops import Stops
from sandlot.agent.streams import StreamServer, stream_server
from sandlot.agent.sync import SandboxSync
from sandlot.agent.uses import SandboxUses
from sandlot.agent.workpools import SandboxPools
from sandlot.policy.imagegc import DiskUsage
from sandlot.policy.ocispec import ALL_CAPABILITIES
from sandlot.policy.suspension import live_uids


@dataclass
class AgentWiring:
    """What the agent has before containerd answers, and the parts use."""

    settings: AgentSettings
    objects: Objects
    status: StatusWriter
    metrics: AgentMetrics
    gc_metrics: GcMetrics
    registry: CollectorRegistry
    pool: SandboxPools
    sandbox_watch: WatchCache
    node_watch: WatchCache
    prune_watch: WatchCache
    snapshot_watch: WatchCache
    uses: SandboxUses
    """Where the stream server, the idle loop and the sync meet."""
    address: str
    clock: Callable[[], datetime]
    stop: threading.Event
    sync_wake: threading.Event
    disk_usage: Callable[[], DiskUsage]
    """containerd's root's filesystem, now."""
    disk_usages: Callable[[], Sequence[DiskUsage]]
    """containerd's root's filesystem, and the logs' where they are kept, now."""
    containerd_version: str = ""
    """What containerd said it is, once it answered."""


@dataclass(frozen=True)
class AgentParts:
    runtime: Runtime
    networking: Networking
    image_gate: ImageGate
    close_pulls: Callable[[], None]
    logs: SandboxLogs
    snapshots: Snapshots
    collector: ImageCollector
    work: SandboxWork
    storage: EphemeralStorage
    cache: CacheUpkeep
    pressure: DiskPressure
    idle: IdlePauses
    sync: SandboxSync
    reaper: Reaper
    streams: StreamServer | None
    """None: the node serves no streams (``stream_port`` 0)."""

    def close(self) -> None:
        """What the parts hold beside the loops (the pulls, the runtime's channel)."""
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


def _live_uids(sandbox_watch: WatchCache) -> frozenset[str] | None:
    """This node's non-terminal Sandboxes' uids; None until the watch has listed."""
    if not sandbox_watch.synced.is_set():
        return None
    return live_uids(sandbox_watch.items())


def image_collector(
    w: AgentWiring, runtime: Runtime, image_gate: ImageGate, snapshots: Snapshots
) -> ImageCollector:
    """The image collector over ``runtime``, its backoff as the node last recorded it."""
    settings = w.settings
    return ImageCollector(
        runtime,
        w.disk_usage,
        settings.gc_thresholds,
        pinned=settings.pinned_images,
        live_job_prefixes=settings.live_job_prefix,
        clock=w.clock,
        call_timeout=settings.call_timeout.total_seconds(),
        disabled=settings.gc_disabled,
        metrics=w.gc_metrics,
        exhausted_until=restored_exhausted_until(w.objects, settings.node_name),
        starting=image_gate.pulls.starting,
        live_uids=partial(_live_uids, w.sandbox_watch),
        live_snapshots=snapshots.live_uids,
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
        uses=w.uses,
    )


def _disk_upkeep(
    w: AgentWiring, runtime: Runtime, work: SandboxWork, collector: ImageCollector
) -> tuple[EphemeralStorage, CacheUpkeep, DiskPressure]:
    """Each sandbox's disk limit, the image GC passes and CachePrune answers, and the
    node's disk pressure (which runs a GC pass before it evicts)."""
    settings = w.settings
    storage = EphemeralStorage(
        runtime, w.pool, work, settings.log_dir, interval=settings.log_interval.total_seconds()
    )
    cache = CacheUpkeep(w.objects, settings.node_name, w.prune_watch, collector, w.clock)
    pressure = DiskPressure(
        storage,
        w.disk_usages,
        settings.gc_high / 100,
        settings.gc_low / 100,
        cache.gc_once,
        transition=settings.disk_pressure_transition.total_seconds(),
        on_change=w.sync_wake.set,
        publish=lambda disk: w.objects.patch_node_status(settings.node_name, {"disk": disk}),
    )
    return storage, cache, pressure


def _stream_server(w: AgentWiring, idle: IdlePauses) -> StreamServer | None:
    """The stream server (None: off), thawing paused sandboxes through ``idle``."""
    return stream_server(
        w.settings,
        w.sandbox_watch,
        w.stop,
        uses=w.uses,
        wake=idle.wake,
        metrics=w.metrics,
        api=w.objects.api,
    )


def build_agent_parts(w: AgentWiring, runtime: Runtime) -> AgentParts:
    """The parts over ``runtime``, each handed only what it uses, each built after
    what it uses."""
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
    store = StateStore.from_settings(settings, runtime, w.objects)
    # Before the starts: a forked sandbox starts from the image its snapshot names.
    snapshots = Snapshots(stops, w.pool, w.snapshot_watch, w.sandbox_watch, w.clock, store=store)
    collector = image_collector(w, runtime, image_gate, snapshots)
    starts = Starts(
        stops,
        node_facts(settings, w.address, w.containerd_version),
        collector.touch_image,  # the image's last use, kept on its record
        w.clock,
        image_gate=image_gate,
        log_writer=logs.writer,
        sandboxes=w.sandbox_watch.items,
        environment=Environment(
            node_brokered_data(w.objects.api, settings.namespace, settings.node_name)
        ),
        fork_image=snapshots.fork_image,
    )
    work = SandboxWork(starts, stops)
    storage, cache, pressure = _disk_upkeep(w, runtime, work, collector)
    idle = idle_pauses(w, runtime, call_timeout)
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
        uses=w.uses,
        idle=idle,
        store=store,
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
    streams = _stream_server(w, idle)
    return AgentParts(
        runtime,
        networking,
        image_gate,
        close_pulls,
        logs,
        snapshots,
        collector,
        work,
        storage,
        cache,
        pressure,
        idle,
        sync,
        reaper,
        streams,
    )


__all__ = ["AgentParts", "AgentWiring", "build_agent_parts", "node_facts"]
