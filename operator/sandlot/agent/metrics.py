"""The agent's Prometheus metrics, on a registry given by the caller (tests use a
fresh ``CollectorRegistry`` each), and a ``Runtime`` wrapper that times every
containerd call by method."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandlot.adapters.runtime import Runtime
from sandlot.policy.imagegc import HoldReason

CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# One start's phases, in order (``agent.starts``): checks, references, image config
# and the OCI spec; the container; its write caps; CNI; the task; Running written.
START_PHASES = ("prepare", "create", "caps", "network", "task", "status")


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # Long on purpose: one declaration per metric, a table best read whole.
        self.registry = registry
        self.teardowns = Counter(
            "sandlot_agent_teardowns_total",
            "Container teardowns, by outcome (clean, kill_wait_timeout, error).",
            ["outcome"],
            registry=registry,
        )
        self.network_policy_installs = Counter(
            "sandlot_agent_network_policy_installs_total",
            "Sandbox packet filters installed, by trigger (start; peers: an ingress "
            "selector's peers changed).",
            ["trigger"],
            registry=registry,
        )
        self.orphans_removed = Counter(
            "sandlot_agent_orphans_removed_total",
            "Orphan containers torn down (no Sandbox, terminal, or another node's).",
            registry=registry,
        )
        self.fenced = Counter(
            "sandlot_agent_fenced_total",
            "Containers torn down because their Sandbox was marked Dead.",
            registry=registry,
        )
        self.readopted = Counter(
            "sandlot_agent_readopted_total",
            "Running sandboxes whose surviving container was kept at start-up.",
            registry=registry,
        )
        self.log_bytes_dropped = Counter(
            "sandlot_agent_log_bytes_dropped_total",
            "Bytes of sandbox output read but not written to its log (the log disk failed).",
            registry=registry,
        )
        self.exec_commands = Counter(
            "sandlot_exec_commands_total",
            "Commands of sandlot exec started, by the way they went (executor: forked by "
            "the sandbox's executor; runtime: the runtime's exec).",
            ["via"],
            registry=registry,
        )
        self.exec_fallbacks = Counter(
            "sandlot_exec_fallbacks_total",
            "Commands run through the runtime's exec instead of the sandbox's executor, by "
            "reason (absent, backoff, start_failed, broken).",
            ["reason"],
            registry=registry,
        )
        self.executor_starts = Counter(
            "sandlot_executor_starts_total",
            "Executors started in sandboxes, by outcome (started, failed).",
            ["outcome"],
            registry=registry,
        )
        self.log_passes = Counter(
            "sandlot_agent_log_passes_total",
            "Log passes that ran to the end (output attached and detached, the files of "
            "sandboxes gone or ended removed).",
            registry=registry,
        )
        self.sync_passes = Counter(
            "sandlot_agent_sync_passes_total",
            "Sync passes that ran to the end (the node's sandboxes set against its "
            "containers, every action handed to its worker).",
            registry=registry,
        )
        self.modes_at_once = Counter(
            "sandlot_agent_mode_changes_at_once_total",
            "Pauses and resumes handed to their sandbox's work straight from the watch "
            "event of the spec's change, without waiting for a sync pass.",
            registry=registry,
        )
        self.unrecorded_thaws = Counter(
            "sandlot_agent_unrecorded_thaws_total",
            "Frozen tasks thawed because nothing recorded why they were frozen (a "
            "pause, commit or snapshot whose record was lost) while the spec asks for "
            "Running.",
            registry=registry,
        )
        self.reaper_passes = Counter(
            "sandlot_agent_reaper_passes_total", "Reaper passes.", registry=registry
        )
        self.idle_passes = Counter(
            "sandlot_agent_idle_passes_total",
            "Passes sampling the sandboxes with an idle timeout (sessions, CPU).",
            registry=registry,
        )
        self.idle_pauses = Counter(
            "sandlot_agent_idle_pauses_total",
            "Sandboxes paused for being idle past their idleTimeoutSeconds.",
            registry=registry,
        )
        self.idle_resumes = Counter(
            "sandlot_agent_idle_resumes_total",
            "Idle-paused sandboxes resumed by an exec, files call or port-forward.",
            registry=registry,
        )
        self.idle_suspends = Counter(
            "sandlot_agent_idle_suspends_total",
            "Sandboxes suspended for being idle past their idleTimeoutSeconds "
            "(idleAction Suspend).",
            registry=registry,
        )
        self.idle_restores = Counter(
            "sandlot_agent_idle_restores_total",
            "Idle-suspended sandboxes started again by an exec, files call, port-forward or claim.",
            registry=registry,
        )
        self.storage_passes = Counter(
            "sandlot_agent_ephemeral_storage_passes_total",
            "Passes measuring the disk use of sandboxes with an ephemeral storage limit.",
            registry=registry,
        )
        self.storage_exceeded = Counter(
            "sandlot_agent_ephemeral_storage_exceeded_total",
            "Sandboxes stopped (Failed, EphemeralStorageExceeded) over their disk limit.",
            registry=registry,
        )
        self.readiness_probes = Counter(
            "sandlot_agent_readiness_probes_total",
            "Readiness probes run, by handler (exec, httpGet, tcpSocket) and result "
            "(success, failure).",
            ["handler", "result"],
            registry=registry,
        )
        self.readiness_passes = Counter(
            "sandlot_agent_readiness_passes_total",
            "Passes of the prober over the node's Running sandboxes.",
            registry=registry,
        )
        self.reaped = Counter(
            "sandlot_agent_reaped_total",
            "Exited containers the reaper tore down.",
            registry=registry,
        )
        self.call_seconds = Histogram(
            "sandlot_agent_containerd_call_seconds",
            "Latency of containerd calls, by method (timeouts included).",
            ["method"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.containerd_up = Gauge(
            "sandlot_agent_containerd_up",
            "1 when the last containerd connection attempt answered.",
            registry=registry,
        )
        self.sandboxes = Gauge(
            "sandlot_agent_sandboxes",
            "Sandboxes bound to this node, by phase, at the last sync.",
            ["phase"],
            registry=registry,
        )
        self.start_phase_seconds = Histogram(
            "sandlot_agent_start_phase_seconds",
            "Seconds of each phase of a sandbox start (prepare: rules, runtime class, "
            "image, references, OCI spec; create; caps; network; task; status: Running "
            "written), a start that fails included.",
            ["phase"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        for phase in START_PHASES:
            self.start_phase_seconds.labels(phase)
        self.startup_seconds = Gauge(
            "sandlot_agent_startup_seconds",
            "Seconds from start to the first Lease renewal (sweep and re-adopt included).",
            registry=registry,
        )
        for outcome in ("clean", "kill_wait_timeout", "error"):
            self.teardowns.labels(outcome)


@contextmanager
def timed_phase(metrics: AgentMetrics, phase: str) -> Iterator[None]:
    """Observe the block's seconds as ``phase`` of a start, however it ends."""
    began = time.monotonic()
    try:
        yield
    finally:
        metrics.start_phase_seconds.labels(phase).observe(time.monotonic() - began)


class TimedRuntime:
    """A ``Runtime`` that observes each call's latency in ``call_seconds{method}``."""

    def __init__(self, inner: Runtime, metrics: AgentMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or not callable(attr) or name == "close":
            return attr
        histogram = self._metrics.call_seconds.labels(name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.monotonic()
            try:
                return attr(*args, **kwargs)
            finally:
                histogram.observe(time.monotonic() - began)

        return timed


def timed_runtime(inner: Runtime, metrics: AgentMetrics) -> Runtime:
    return cast(Runtime, TimedRuntime(inner, metrics))


class GcMetrics:
    """The collector's Prometheus metrics, registered on the registry given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.passes = Counter(
            "sandlot_agent_gc_passes_total",
            "Image GC passes, by pass kind and outcome.",
            ["kind", "outcome"],
            registry=registry,
        )
        self.records_removed = Counter(
            "sandlot_agent_gc_records_removed_total",
            "Image records removed by GC.",
            ["kind"],
            registry=registry,
        )
        self.bytes_freed = Counter(
            "sandlot_agent_gc_bytes_freed_total",
            "Bytes freed by image GC, measured on containerd's filesystem.",
            ["kind"],
            registry=registry,
        )
        self.held_back = Gauge(
            "sandlot_agent_gc_held_back_bytes",
            "Bytes of images the last GC pass kept, by reason.",
            ["reason"],
            registry=registry,
        )
        self.backoff_active = Gauge(
            "sandlot_agent_gc_backoff_active",
            "1 while automatic GC passes are skipped by the exhausted backoff.",
            registry=registry,
        )
        self.disk_usage_ratio = Gauge(
            "sandlot_agent_disk_usage_ratio",
            "Used fraction of the filesystem holding containerd's root.",
            registry=registry,
        )
        for reason in HoldReason:
            self.held_back.labels(reason.value)
        for kind in ("watermark", "forced"):
            self.records_removed.labels(kind)
            self.bytes_freed.labels(kind)
