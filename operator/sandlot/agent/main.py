"""The node agent: runs this node's sandboxes on containerd and keeps it honest.

Start-up is strictly ordered (SPEC section 4): connect to containerd (retried
with a capped backoff and reported, never a crash loop) -> orphan sweep ->
re-adopt -> SandboxNode registered and Lease renewed (the node becomes READY) ->
sandboxes accepted -> reaper, image collector and CachePrune handling. The sweep
is bounded (see ``sweep`` and ``teardown``), so READY always comes.

After start-up the agent is a few loops on threads (``loops``), each doing
bounded work, and each a thin shell over a pure decision:

- **sync** (``sync``, deciding with ``policy.agentsync``): start Scheduled
  sandboxes, stop deleted or drained ones, tear down fenced ones, on a bounded
  worker pool (graceful stops beside it, ``workpools``), one operation per sandbox
  at a time. The Sandboxes (server-side field selector), the node's SandboxNode and
  the CachePrune requests are kept in memory by list + watch
  (``adapters.sandboxwatch``), so an idle node costs the API server no request: a
  change wakes a pass (at once while at most ``sync_burst`` passes per
  ``sync_interval`` allow; ``policy.syncpacing``), the end of any sandbox's work
  wakes one, and a pass runs every ``resync_interval`` regardless, from memory.
- **reaper** (``reaper``, ``policy.agentreap``; every ``reap_interval``): tasks
  that have provably exited are torn down and their Sandbox ended with the exit
  code. A running task is never touched.
- **ephemeral storage** (``ephemeralstorage``; every ``log_interval``, sooner for
  a sandbox growing towards its limit): sandboxes over it end Failed and are killed.
- **readiness** (``readiness``, deciding with ``policy.readiness``; every
  ``PROBE_TICK``): each Running, unpaused sandbox's readiness probe when it is due,
  and its ``Ready`` condition written on a transition.
- **network policy** (``netpolicy``, ``policy.netpolicy``; every
  ``network_policy_resync``, with CNI): filters whose admitted peers changed are
  rendered and installed again.
- **disk pressure** (``diskpressure``, every ``PRESSURE_TICK``): at or over the
  high watermark, image GC, then sandboxes evicted down to the low one; new starts
  held meanwhile.
- **image GC** (every ``gc_interval``), **CachePrune** requests (``cacheprune``).

Status is written through ``adapters.statuswrite`` (``status``): with the object's
resourceVersion; a Sandbox found terminal, gone or replaced meanwhile is never
resurrected (its container is torn down instead).

This module only wires those parts together and runs the start-up in its order
(the steps themselves are in ``bringup``); the parts that work on containerd are
built once it answers (``parts``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from sandlot.adapters.nodelock import NodeLock
from sandlot.adapters.objects import Leases, Objects
from sandlot.adapters.runtime import Runtime
from sandlot.adapters.sandboxwatch import cache_prunes, node_sandboxes, node_snapshots, own_node
from sandlot.adapters.startorder import StartedParts, ThreadPart
from sandlot.agent.bringup import (
    connect_containerd,
    limit_sandbox_parent,
    readopt_survivors,
    registration,
    sweep_with_retry,
)
from sandlot.agent.diskpressure import PRESSURE_TICK
from sandlot.agent.health import serve_agent_health
from sandlot.agent.heartbeat import Heartbeat
from sandlot.agent.imagegc import ImageCollector, disk_usage_of
from sandlot.agent.loops import Loops
from sandlot.agent.metrics import AgentMetrics, GcMetrics
from sandlot.agent.parts import AgentParts, AgentWiring, build_agent_parts
from sandlot.agent.readiness import PROBE_TICK, readiness_prober
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.settings import AgentSettings
from sandlot.agent.snapshots import SNAPSHOT_TICK
from sandlot.agent.status import StatusWriter
from sandlot.agent.streams import StreamServer
from sandlot.agent.sweep import SweepReport
from sandlot.agent.sync import sandbox_listener, unschedulable
from sandlot.agent.uses import SandboxUses
from sandlot.agent.workpools import SandboxPools
from sandlot.api.timestamps import utcnow
from sandlot.policy.imagegc import DiskUsage
from sandlot.policy.limits import ParentLimits

log = logging.getLogger(__name__)

TLS_REFRESH = 60.0  # seconds between looks at the stream server's certificate files

NODE_LOCK_POLL = 0.5  # seconds between tries while another agent holds the node


def detect_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Agent:
    """One node's agent. ``start()`` starts its parts in their order (``in_order``);
    ``shutdown()`` stops the started ones in reverse.

    Sandboxes keep running when the agent stops: the next agent re-adopts them.
    """

    def __init__(
        self,
        settings: AgentSettings,
        api: Any,
        *,
        runtime_factory: Callable[[], Runtime] | None = None,
        registry: CollectorRegistry | None = None,
        disk_usage: Callable[[], DiskUsage] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.node = settings.node_name
        self.objects = Objects(api)
        self.leases = Leases(api, settings.namespace)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        self.gc_metrics = GcMetrics(self.registry)
        self._runtime_factory = runtime_factory or self._containerd
        self._disk_usage = disk_usage or (lambda: disk_usage_of(settings.containerd_root))
        self._clock = clock
        self.address = settings.node_address or detect_address()
        self.call_timeout = settings.call_timeout.total_seconds()

        # Built once containerd answers (``parts``): whatever works on containerd.
        self._parts: AgentParts | None = None
        self.containerd_version = ""
        self.heartbeat = Heartbeat(
            self.objects,
            self.leases,
            node_name=self.node,
            lease_duration=settings.lease_duration.total_seconds(),
            renew_interval=settings.renew_interval.total_seconds(),
            clock=clock,
        )
        self.sweep_report: SweepReport | None = None
        self.parent_limits: ParentLimits | None = None
        self.startup_seconds: float | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._metrics_server: Any = None
        self.node_lock = NodeLock(settings.state_dir, self.node)
        # What the sync and the CachePrune handling read instead of listing: started
        # once the node is READY, each wakes its loop on a change that matters.
        self._sync_wake = threading.Event()
        self._prune_wake = threading.Event()
        watched = {"watch_timeout": max(1, round(settings.watch_timeout.total_seconds()))}
        # The Sandboxes' listener hands mode changes to the sync: it starts with it.
        self.sandbox_watch = node_sandboxes(api, self.node, **watched)
        self.node_watch = own_node(api, self.node, on_change=self._node_changed, **watched)
        self.prune_watch = cache_prunes(api, on_change=self._prune_changed, **watched)
        self.snapshot_watch = node_snapshots(api, self.node, **watched)
        # Where the stream server, the idle loop and the sync meet: built before them.
        self.uses = SandboxUses(
            self.sandbox_watch.get, self._sync_wake.set, max_sessions=settings.stream_max_sessions
        )
        # The parts that need no containerd, each handed only what it uses.
        self.loops = Loops(self._stop)
        self.pool = SandboxPools(
            settings.teardown_concurrency, settings.capacity, self._stop, self._sync_wake
        )
        self.status = StatusWriter(
            self.objects,
            self.node,
            self._clock,
            observe=self.sandbox_watch.observe,
            latest=self.sandbox_watch.get,
        )
        self.prober = readiness_prober(
            settings, self.sandbox_watch, self.status, self.metrics, self._stop, self.pool.busy
        )
        self._started = StartedParts()
        self._began = 0.0

    def in_order(self) -> list[ThreadPart]:
        """The start-up (SPEC section 4), one part a step: each starts after those
        above it and stops after those below it (``docs/architecture.md``)."""
        return [
            ThreadPart("health", self._serve_health, self._stop_health),
            # One agent per node, before containerd is touched: a second one's sweep
            # would tear down what the first is starting. Not ready meanwhile.
            ThreadPart("node-lock", self.take_node_lock, self.node_lock.release),
            ThreadPart("containerd", self.connect, self._close_parts),
            ThreadPart("streams", self._start_streams, self._stop_streams),
            # Before any sandbox starts: the sum of them never takes the node's own share.
            ThreadPart("parent-cgroup", self._limit_parent),
            # Orphan sweep and re-adopt: before the node says it is alive.
            ThreadPart("sweep", self._sweep),
            ThreadPart("output", self._take_output_back, self._stop_output),
            # The work pools and the prober stop once the loops that feed them did,
            # and before the output and the runtime their work uses.
            ThreadPart("pools", stop=self._stop_pools),
            ThreadPart("heartbeat", self._start_heartbeat, self.heartbeat.stop),
            ThreadPart("watches", self._start_watches, self._stop_watches),
            ThreadPart("loops", self._start_loops, self._stop_loops),
        ]

    @property
    def parts(self) -> AgentParts:
        """The parts working on containerd (there once it answered)."""
        if self._parts is None:
            raise RuntimeError("not connected to containerd")
        return self._parts

    @property
    def runtime(self) -> Runtime | None:
        return self._parts.runtime if self._parts is not None else None

    @property
    def collector(self) -> ImageCollector | None:
        return self._parts.collector if self._parts is not None else None

    @property
    def streams(self) -> StreamServer | None:
        return self._parts.streams if self._parts is not None else None

    def _wiring(self) -> AgentWiring:
        return AgentWiring(
            settings=self.settings,
            objects=self.objects,
            status=self.status,
            metrics=self.metrics,
            gc_metrics=self.gc_metrics,
            registry=self.registry,
            pool=self.pool,
            sandbox_watch=self.sandbox_watch,
            node_watch=self.node_watch,
            prune_watch=self.prune_watch,
            snapshot_watch=self.snapshot_watch,
            uses=self.uses,
            address=self.address,
            clock=self._clock,
            stop=self._stop,
            sync_wake=self._sync_wake,
            disk_usage=self._disk_usage,
            disk_usages=self._disk_usages,
            containerd_version=self.containerd_version,
        )

    def _disk_usages(self) -> list[DiskUsage]:
        """containerd's root's filesystem, and the logs' where they are kept."""
        log_dir = self.settings.log_dir  # made at the first sandbox's start
        kept = bool(log_dir) and os.path.isdir(log_dir)
        return [self._disk_usage()] + ([disk_usage_of(log_dir)] if kept else [])

    # ------------------------------------------------------------ lifecycle

    def _containerd(self) -> Runtime:
        from sandlot.adapters.containerd import ContainerdRuntime

        return ContainerdRuntime(
            self.settings.containerd_address, self.settings.containerd_namespace
        )

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> bool:
        """The ordered start-up; True once the node is READY and the loops run."""
        self._began = time.monotonic()
        return self._started.start(self.in_order())

    def run_forever(self) -> int:
        try:
            if not self.start():
                return 0 if self.stopping else 1  # asked to stop during start-up: clean
            self._stop.wait()
            return 0
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """End the loops (sandboxes keep running), then every started part in reverse.
        Bounded: every call in flight is."""
        self._stop.set()
        self._sync_wake.set()
        self._prune_wake.set()
        self._started.close()

    # ------------------------------------------------------------ the parts' steps

    def _serve_health(self) -> None:
        if self.settings.metrics_port:
            self._metrics_server = serve_agent_health(
                self.settings.metrics_port, self.registry, self.ready, lambda: self.runtime
            )

    def _stop_health(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()

    def take_node_lock(self) -> bool:
        """Wait, saying why, until no other agent of this node runs; False on stop."""
        told = None
        try:
            while not self.node_lock.try_acquire():
                holder = self.node_lock.holder()
                if holder != told:
                    log.warning(
                        "another agent of node %s (pid %s) holds %s: waiting for it to "
                        "exit before touching containerd",
                        self.node,
                        holder,
                        self.node_lock.path,
                    )
                    told = holder
                if self._stop.wait(NODE_LOCK_POLL):
                    return False
        except OSError as exc:
            log.error("cannot take the node lock %s: %s", self.node_lock.path, exc)
            return False
        if told is not None:
            log.info("node lock %s taken: the other agent exited", self.node_lock.path)
        return True

    def connect(self) -> bool:
        """Connect to containerd, retrying with a capped backoff until it answers or
        stop; then build the parts over it."""
        connected = connect_containerd(
            self._runtime_factory, self.settings, self.metrics, self._stop
        )
        if connected is None:
            return False
        runtime, self.containerd_version = connected
        try:
            self._parts = build_agent_parts(self._wiring(), runtime)
        except BaseException:
            runtime.close()
            raise
        return True

    def _close_parts(self) -> None:
        self.parts.close()

    def _stop_pools(self) -> None:
        self.pool.shutdown()
        self.prober.shutdown()

    def _start_streams(self) -> None:
        if self.streams is not None:
            try:
                self.streams.start()
            except BaseException:
                self.streams.shutdown()
                raise

    def _stop_streams(self) -> None:
        if self.streams is not None:
            self.streams.shutdown()

    def _limit_parent(self) -> None:
        self.parent_limits = limit_sandbox_parent(self.settings)

    def _sweep(self) -> bool:
        parts = self.parts
        report = sweep_with_retry(
            parts.runtime,
            self.objects,
            self.settings,
            self.metrics,
            self._stop,
            parts.networking.release,
        )
        if report is None:
            return False
        self.sweep_report = report
        readopt_survivors(
            parts.runtime, report, self.metrics, self.call_timeout, parts.work.end_lost
        )
        return True

    def _take_output_back(self) -> None:
        """Read the survivors' output again (their writes wait in full pipes meanwhile),
        before the node says it is alive; a failure is retried by the log pass."""
        logs = self.parts.logs
        if logs.writer is None:
            return
        logs.writer.start()
        try:
            logs.pass_once()
        except Exception as exc:
            log.warning("cannot take the sandboxes' output back yet: %s", exc)

    def _stop_output(self) -> None:
        writer = self.parts.logs.writer
        if writer is not None:  # the tasks' output waits in their pipes
            writer.stop()

    def _start_heartbeat(self) -> None:
        """The SandboxNode and the Lease: from here the operator counts the node Ready."""
        self._register_node(self.parts)
        self.heartbeat.start()
        self.startup_seconds = time.monotonic() - self._began
        self.metrics.startup_seconds.set(self.startup_seconds)
        report = self.sweep_report
        log.info(
            "node %s ready after %.2fs (swept %d containers, re-adopted %d)",
            self.node,
            self.startup_seconds,
            len(report.decisions) if report is not None else 0,
            len(report.adopted) if report is not None else 0,
        )
        self.ready.set()

    def _start_watches(self) -> None:
        self.sandbox_watch.start(sandbox_listener(self.parts.sync, self._sync_wake, self.uses))
        for watched in (self.node_watch, self.prune_watch, self.snapshot_watch):
            watched.start()

    def _stop_watches(self) -> None:
        for watched in self._watches:
            watched.stop()

    def _start_loops(self) -> None:
        """Sandboxes, then the reaper, the image collector and CachePrune requests."""
        settings, parts = self.settings, self.parts
        pacing = settings.sync_pacing
        self.loops.spawn_woken("sync", parts.sync.sync_once, self._sync_wake, pacing)
        self.loops.spawn("reaper", parts.reaper.reap_once, settings.reap_interval.total_seconds())
        self.loops.spawn("imagegc", parts.cache.gc_once, settings.gc_interval.total_seconds())
        self.loops.spawn("logs", parts.logs.pass_once, settings.log_interval.total_seconds())
        self.loops.spawn_due("storage", parts.storage.step, settings.log_interval.total_seconds())
        self.loops.spawn("snapshots", parts.snapshots.pass_once, SNAPSHOT_TICK)
        self.loops.spawn("diskpressure", parts.pressure.pass_once, PRESSURE_TICK)
        self.loops.spawn("readiness", self.prober.pass_once, PROBE_TICK)
        if parts.networking.enabled and parts.work.network_policies.enabled:
            self.loops.spawn(
                "netpolicy",
                parts.work.network_policies.refresh_once,
                settings.network_policy_resync.total_seconds(),
            )
        if parts.streams is not None:  # rotated stream certificates, without a restart
            self.loops.spawn("tls", parts.streams.refresh_tls, TLS_REFRESH)
        self.loops.spawn("idle", parts.idle.pass_once, settings.idle_interval.total_seconds())
        self.loops.spawn_woken("cacheprune", parts.cache.prune_once, self._prune_wake, pacing)

    def _stop_loops(self) -> None:
        self._stop.set()
        self._sync_wake.set()
        self._prune_wake.set()
        network_bound = self.parts.networking.bound
        self.loops.join(timeout=self.settings.teardown_bound + network_bound + 5)

    def busy(self, key: str) -> bool:
        return self.pool.busy(key)

    # ------------------------------------------------------------ watches

    @property
    def _watches(self) -> tuple[Any, ...]:
        return (self.sandbox_watch, self.node_watch, self.prune_watch, self.snapshot_watch)

    def _node_changed(
        self, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        # The operator writes the node's status often; only a drain matters here.
        if event == "LISTED" or unschedulable(old) != unschedulable(new):
            self._sync_wake.set()

    def _prune_changed(self, _event: str, _old: object, _new: object) -> None:
        self._prune_wake.set()

    def _register_node(self, parts: AgentParts) -> None:
        status = registration(
            self.objects,
            self.settings,
            parts.work.facts,
            self.address,
            self.containerd_version,
        )
        status["disk"] = parts.pressure.disk_status()
        try:
            self.heartbeat.register(status)
        except Exception as exc:
            log.warning("cannot register SandboxNode %s: %s", self.node, exc)


__all__ = ["Agent", "container_id_for", "detect_address"]
