"""The node agent: runs this node's sandboxes on containerd and keeps it honest.

Start-up is strictly ordered (SPEC section 4): connect to containerd (retried
with a capped backoff and reported, never a crash loop) -> orphan sweep ->
re-adopt -> SandboxNode registered and Lease renewed (the node becomes READY) ->
sandboxes accepted -> reaper, image collector and CachePrune handling. The sweep
is bounded (see ``sweep`` and ``teardown``), so READY always comes.

After start-up the agent is a few loops on threads, each doing bounded work:

- **sync**: compare this node's Sandboxes with the containers, and hand each
  difference to a bounded worker pool: start Scheduled ones, stop deleted or
  drained ones, tear down fenced ones. A sandbox with work in flight is skipped
  until that work ends, so one sandbox never has two operations at once. The
  Sandboxes (server-side field selector), the node's SandboxNode and the CachePrune
  requests are kept in memory by list + watch (``adapters.sandboxwatch``), so an
  idle node costs the API server no request: a change wakes a pass (at most one
  per ``sync_interval``), the end of any sandbox's work wakes one, and a pass runs
  every ``resync_interval`` regardless, from memory.
- **reaper** (every ``reap_interval``): tasks that have provably exited are torn
  down and their Sandbox ended with the exit code. A running task is never touched.
- **image GC** (every ``gc_interval``) and **CachePrune** requests (woken by their
  watch, like the sync).

Status is written through the status subresource with the object's
resourceVersion; a 409 re-reads, and a Sandbox found terminal or gone meanwhile is
never resurrected (its container is torn down instead).
"""

from __future__ import annotations

import contextlib
import logging
import signal as signals
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from pydantic import ValidationError

import sandlot
from sandlot.adapters.agentapi import (
    is_conflict,
    is_not_found,
    patch_cacheprune_result,
)
from sandlot.adapters.cni import (
    Attachment,
    CniError,
    NoNetworkConfig,
    SandboxNetwork,
    join_netns,
    load_config,
)
from sandlot.adapters.containerd.ocispec import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    DEFAULT_PIDS_LIMIT,
    cgroups_path_for,
    default_spec,
)
from sandlot.adapters.nodeguard import (
    bounding_capabilities,
    namespace_labels,
    oom_kills,
    swap_accounted,
)
from sandlot.adapters.objects import Leases, Objects, parse_time, rfc3339
from sandlot.adapters.runtime import (
    ContainerInfo,
    ContainerSpec,
    ImageConfig,
    NotFound,
    Runtime,
    RuntimeError_,
    TaskInfo,
    TaskState,
)
from sandlot.adapters.sandboxwatch import cache_prunes, node_sandboxes, own_node
from sandlot.agent.heartbeat import Heartbeat
from sandlot.agent.imagegc import GcMetrics, GcResult, ImageCollector, disk_usage_of
from sandlot.agent.metrics import AgentMetrics, timed_runtime
from sandlot.agent.settings import AgentSettings, NetworkMode
from sandlot.agent.sweep import SweepReport, readopt, sweep_orphans
from sandlot.agent.teardown import TeardownResult, stop, teardown
from sandlot.api.admission import Level, cap_name, level_of
from sandlot.api.keys import SANDBOX_LABEL, SANDBOX_UID_LABEL
from sandlot.api.sandbox import (
    REASON_OOM_KILLED,
    REASON_POLICY_VIOLATION,
    REASON_RUN_AS_ROOT,
    TERMINAL_PHASES,
    SandboxSpec,
)
from sandlot.policy.agentsweep import SweepAction
from sandlot.policy.imagegc import DiskUsage, pass_for_request
from sandlot.policy.podsecurity import Violation, check, describe

log = logging.getLogger(__name__)

CONNECT_BACKOFF_START = 0.5
CONNECT_BACKOFF_CAP = 30.0
MAX_STATUS_ATTEMPTS = 5
REASON_NETWORK_SETUP_FAILED = "NetworkSetupFailed"
# How long a failing CNI DEL keeps its container for retries before the agent gives
# up on it (a broken or removed network configuration never DELs): long enough for a
# network daemon to restart, short enough that a node does not retry forever.
RELEASE_PATIENCE = 120.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def _phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "Pending")


def _unschedulable(node: Mapping[str, Any] | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def container_id_for(uid: str) -> str:
    """The container of a Sandbox is named after its uid: unique, and stable across restarts."""
    return f"sb-{uid}"


def detect_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _user(spec: SandboxSpec, config: ImageConfig) -> tuple[int, int]:
    ctx = spec.security_context
    uid = ctx.run_as_user if ctx and ctx.run_as_user is not None else None
    gid = ctx.run_as_group if ctx and ctx.run_as_group is not None else None
    if uid is None and config.user:
        name, _, group = config.user.partition(":")
        if name.isdigit():
            uid = int(name)
        if group.isdigit() and gid is None:
            gid = int(group)
    return (uid or 0, gid if gid is not None else 0)


_MEMORY_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def _memory_bytes(quantity: str) -> int:
    digits = quantity.rstrip("kMGTi")
    return int(digits) * _MEMORY_UNITS[quantity[len(digits) :]]


def _cpu_quota(quantity: str, period: int = 100_000) -> int:
    cores = int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    return max(1000, int(cores * period))


class RunAsRootRefused(ValueError):
    """``runAsNonRoot`` is set and the process would run as UID 0."""


def _capabilities(spec: SandboxSpec, node_capabilities: Sequence[str]) -> list[str]:
    ctx = spec.security_context
    adds = list(ctx.capabilities.add) if ctx and ctx.capabilities else []
    if (ctx and ctx.privileged) or any(cap_name(c) == "ALL" for c in adds):
        return list(node_capabilities)
    return list(dict.fromkeys([*DEFAULT_CAPABILITIES, *(f"CAP_{cap_name(c)}" for c in adds)]))


def build_oci_spec(
    name: str,
    spec: SandboxSpec,
    config: ImageConfig,
    *,
    hostname: str,
    pids_limit: int | None = DEFAULT_PIDS_LIMIT,
    limit_swap: bool = False,
    node_capabilities: Sequence[str] = ALL_CAPABILITIES,
) -> dict[str, Any]:
    """The OCI spec for a Sandbox: its command (or the image's), env, user, limits and
    security context, on top of ``default_spec``'s safe defaults.

    ``limit_swap`` sets memory+swap to the memory limit (no swap beyond it); only
    where the node's kernel accounts swap, since runc refuses it on cgroup v1
    otherwise. ``node_capabilities`` is what ``privileged`` (or adding ``ALL``)
    grants: every capability the node's runtime can hand out. Raises ``RunAsRootRefused`` when ``runAsNonRoot`` meets UID 0, and
    ``ValueError`` for a spec that cannot run at all.
    """
    args = list(spec.command) or [*config.entrypoint, *config.cmd]
    if not args:
        raise ValueError(f"image {spec.image} has no entrypoint or cmd and spec.command is empty")
    env = [*config.env, *(f"{e.name}={e.value}" for e in spec.env)]
    ctx = spec.security_context
    user = _user(spec, config)
    if ctx and ctx.run_as_non_root and user[0] == 0:
        source = "spec.securityContext.runAsUser" if ctx.run_as_user == 0 else "the image"
        raise RunAsRootRefused(
            f"spec.securityContext.runAsNonRoot is true but the process would run as UID 0 "
            f"(from {source}): set spec.securityContext.runAsUser to a non-zero UID"
        )
    oci = default_spec(
        args,
        env,
        config.working_dir,
        host_network=spec.host_network,
        hostname=hostname[:63],
        user=user,
        cgroups_path=cgroups_path_for(name),
        capabilities=_capabilities(spec, node_capabilities),
        privileged=bool(ctx and ctx.privileged),
        readonly_root=bool(ctx and ctx.read_only_root_filesystem),
        pids_limit=pids_limit,
    )
    limits = spec.resources.limits if spec.resources else None
    resources = oci["linux"]["resources"]
    if limits and limits.memory:
        memory = _memory_bytes(limits.memory)
        resources["memory"] = {"limit": memory, **({"swap": memory} if limit_swap else {})}
    if limits and limits.cpu:
        resources["cpu"] = {"quota": _cpu_quota(limits.cpu), "period": 100_000}
    return oci


class Agent:
    """One node's agent. ``start()`` runs the ordered start-up; ``shutdown()`` ends the loops.

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
        clock: Callable[[], datetime] = _utcnow,
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
        self.kill_wait = settings.kill_wait.total_seconds()
        self.limit_swap = swap_accounted(settings.cgroup_root)
        # containerd and runc run with the node's bounding set, as does this agent
        # (a privileged pod): `privileged` grants exactly that set.
        self.node_capabilities = bounding_capabilities(ALL_CAPABILITIES)
        # Always built: a container attached under an earlier setting is still detached.
        self.network = SandboxNetwork(
            settings.cni_conf_dir,
            settings.cni_bin_dir,
            timeout=settings.cni_timeout.total_seconds(),
        )
        self.cni_enabled = self._resolve_network_mode()
        self._release_failing_since: dict[str, float] = {}

        self.runtime: Runtime | None = None
        self.collector: ImageCollector | None = None
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
        self.startup_seconds: float | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=settings.teardown_concurrency, thread_name_prefix="sandbox"
        )
        self._threads: list[threading.Thread] = []
        self._metrics_server: Any = None
        # What the sync and the CachePrune handling read instead of listing: started
        # once the node is READY, each wakes its loop on a change that matters.
        self._sync_wake = threading.Event()
        self._prune_wake = threading.Event()
        self.sandbox_watch = node_sandboxes(api, self.node, on_change=self._sandbox_changed)
        self.node_watch = own_node(api, self.node, on_change=self._node_changed)
        self.prune_watch = cache_prunes(api, on_change=self._prune_changed)
        self._answered_prunes: set[str] = set()

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

    def connect(self) -> bool:
        """Connect to containerd, retrying with a capped backoff until it answers or stop."""
        delay = CONNECT_BACKOFF_START
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            runtime = self._runtime_factory()
            try:
                self.containerd_version = runtime.version(timeout=self.call_timeout)
            except RuntimeError_ as exc:
                runtime.close()
                self.metrics.containerd_up.set(0)
                log.error(
                    "containerd unreachable at %s (attempt %d): %s; retrying in %.1fs",
                    self.settings.containerd_address,
                    attempt,
                    exc,
                    delay,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, CONNECT_BACKOFF_CAP)
                continue
            self.metrics.containerd_up.set(1)
            self.runtime = timed_runtime(runtime, self.metrics)
            log.info(
                "connected to containerd %s at %s (namespace %s)",
                self.containerd_version,
                self.settings.containerd_address,
                self.settings.containerd_namespace,
            )
            return True
        return False

    def start(self) -> bool:
        """The ordered start-up; True once the node is READY and the loops run."""
        began = time.monotonic()
        if self.settings.metrics_port:
            self._metrics_server, _ = start_http_server(
                self.settings.metrics_port, registry=self.registry
            )
        if not self.connect():
            return False
        rt = self._rt

        # Orphan sweep and re-adopt: before the node says it is alive.
        report = self._sweep_with_retry(rt)
        if report is None:
            return False
        self.sweep_report = report
        tasks: list[TaskInfo] = []
        if any(d.action is SweepAction.ADOPT for d in report.decisions):
            # Only for the log: with a wedged shim on the node this listing is slow.
            try:
                tasks = rt.list_tasks(timeout=self.call_timeout)
            except RuntimeError_ as exc:
                log.warning("cannot list tasks for re-adoption: %s", exc)
        readopt(report, tasks, metrics=self.metrics)
        for lost in report.lost:
            self._end_lost(lost.key)

        # Heartbeat: the SandboxNode and the Lease.
        self._register_node()
        self.heartbeat.start()
        self.startup_seconds = time.monotonic() - began
        self.metrics.startup_seconds.set(self.startup_seconds)
        log.info(
            "node %s ready after %.2fs (swept %d containers, re-adopted %d)",
            self.node,
            self.startup_seconds,
            len(report.decisions),
            len(report.adopted),
        )
        self.ready.set()

        # Work: sandboxes, then the reaper, the image collector and CachePrune requests.
        self.collector = ImageCollector(
            rt,
            self._disk_usage,
            self.settings.gc_thresholds,
            pinned=self.settings.pinned_images,
            live_job_prefixes=self.settings.live_job_prefix,
            clock=self._clock,
            call_timeout=self.call_timeout,
            disabled=self.settings.gc_disabled,
            metrics=self.gc_metrics,
            exhausted_until=self._restored_exhausted_until(),
        )
        for watched in self._watches:
            watched.start()
        self._spawn_woken("sync", self.sync_once, self._sync_wake)
        self._spawn("reaper", self.reap_once, self.settings.reap_interval.total_seconds())
        self._spawn("imagegc", self.gc_once, self.settings.gc_interval.total_seconds())
        self._spawn_woken("cacheprune", self.prune_once, self._prune_wake)
        return True

    def run_forever(self) -> int:
        try:
            if not self.start():
                return 1
            self._stop.wait()
            return 0
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """End the loops (sandboxes keep running). Bounded: every call in flight is."""
        self._stop.set()
        self._sync_wake.set()
        self._prune_wake.set()
        self.heartbeat.stop()
        for watched in self._watches:
            watched.stop()
        for thread in self._threads:
            thread.join(timeout=self.settings.teardown_bound + self.network.bound + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.runtime is not None:
            self.runtime.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()

    @property
    def _rt(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("not connected to containerd")
        return self.runtime

    def _spawn(self, name: str, step: Callable[[], object], interval: float) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    step()
                except Exception:
                    log.exception("%s pass failed", name)
                if self._stop.wait(interval):
                    return

        thread = threading.Thread(target=loop, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _spawn_woken(self, name: str, step: Callable[[], object], wake: threading.Event) -> None:
        """Run ``step`` when ``wake`` is set, at most once per ``sync_interval`` (what
        arrives meanwhile shares the next pass) and at least once per
        ``resync_interval``. A pass that fails runs again after ``sync_interval``."""
        shortest = self.settings.sync_interval.total_seconds()
        longest = self.settings.resync_interval.total_seconds()

        def loop() -> None:
            last: float | None = None
            while not self._stop.is_set():
                if last is not None:
                    wake.wait(max(0.0, last + longest - time.monotonic()))
                    pause = last + shortest - time.monotonic()
                    if self._stop.is_set() or (pause > 0 and self._stop.wait(pause)):
                        return
                # Cleared before the pass: a change arriving during it wakes the next.
                wake.clear()
                last = time.monotonic()
                try:
                    step()
                except Exception:
                    log.exception("%s pass failed", name)
                    wake.set()

        thread = threading.Thread(target=loop, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    @property
    def _watches(self) -> tuple[Any, ...]:
        return (self.sandbox_watch, self.node_watch, self.prune_watch)

    def _sandbox_changed(self, _event: str, _old: object, _new: object) -> None:
        # Every change may matter (phase, deletion, containerId); the agent's own
        # status writes come back here too, and their pass finds nothing to do.
        self._sync_wake.set()

    def _node_changed(
        self, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        # The operator writes the node's status often; only a drain matters here.
        if event == "LISTED" or _unschedulable(old) != _unschedulable(new):
            self._sync_wake.set()

    def _prune_changed(self, _event: str, _old: object, _new: object) -> None:
        self._prune_wake.set()

    # ------------------------------------------------------------ start-up steps

    def _sweep_with_retry(self, rt: Runtime) -> SweepReport | None:
        """List containers and this node's Sandboxes, then sweep; listings are retried."""
        delay = CONNECT_BACKOFF_START
        while not self._stop.is_set():
            try:
                containers = rt.list_containers(timeout=self.call_timeout)
                sandboxes = self.objects.list_node_sandboxes(self.node)
            except Exception as exc:
                log.error("start-up sweep cannot list (retrying in %.1fs): %s", delay, exc)
                self._stop.wait(delay)
                delay = min(delay * 2, CONNECT_BACKOFF_CAP)
                continue
            return sweep_orphans(
                rt,
                containers,
                sandboxes,
                self.node,
                kill_wait=self.kill_wait,
                call_timeout=self.call_timeout,
                concurrency=self.settings.teardown_concurrency,
                metrics=self.metrics,
                release=self._release_network,
            )
        return None

    def _register_node(self) -> None:
        status = {
            "capacity": {"sandboxes": self.settings.capacity},
            "address": self.address,
            "agentVersion": sandlot.__version__,
            "containerdVersion": self.containerd_version,
        }
        try:
            self.heartbeat.register(status)
        except Exception as exc:
            log.warning("cannot register SandboxNode %s: %s", self.node, exc)

    def _restored_exhausted_until(self) -> datetime | None:
        try:
            node = self.objects.get_node(self.node) or {}
        except Exception:
            return None
        gc = (node.get("status") or {}).get("gc") or {}
        return parse_time(gc.get("exhaustedUntil"))

    # ------------------------------------------------------------ bookkeeping

    def _submit(self, key: str, work: Callable[[], object]) -> bool:
        """Run ``work`` on the pool unless ``key`` already has work in flight."""
        with self._busy_lock:
            if key in self._busy or self._stop.is_set():
                return False
            self._busy.add(key)

        def run() -> None:
            try:
                work()
            except Exception:
                log.exception("sandbox %s: work failed", key)
            finally:
                with self._busy_lock:
                    self._busy.discard(key)
                # Passes skipped this key while it was busy, and what the work did
                # (or failed to do) may need a follow-up: look again.
                self._sync_wake.set()

        try:
            self._pool.submit(run)
        except RuntimeError:  # pool shut down
            with self._busy_lock:
                self._busy.discard(key)
            return False
        return True

    def busy(self, key: str) -> bool:
        with self._busy_lock:
            return key in self._busy

    def _count_teardown(self, result: TeardownResult) -> None:
        self.metrics.teardowns.labels(result.outcome.value).inc()

    def _write_status(
        self,
        obj: Mapping[str, Any],
        status: Mapping[str, Any],
        *,
        allowed_from: frozenset[str] | None = None,
    ) -> str:
        """Write status with the resourceVersion; ``written``, ``gone`` or ``skipped``.

        A 409 re-reads: a Sandbox that is now terminal, or (with ``allowed_from``) in
        a phase this write must not overwrite, is left alone.
        """
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        current = obj
        for _ in range(MAX_STATUS_ATTEMPTS):
            phase = _phase(current)
            if phase in TERMINAL_PHASES or (allowed_from is not None and phase not in allowed_from):
                return "skipped"
            try:
                self.objects.patch_sandbox_status(
                    ns, name, status, resource_version=current["metadata"]["resourceVersion"]
                )
                return "written"
            except Exception as exc:
                if is_not_found(exc):
                    return "gone"
                if not is_conflict(exc):
                    log.warning("sandbox %s/%s: status write failed: %s", ns, name, exc)
                    return "skipped"
            try:
                current = self.objects.get_sandbox(ns, name)
            except Exception as exc:
                if is_not_found(exc):
                    return "gone"
                log.warning("sandbox %s/%s: re-read failed: %s", ns, name, exc)
                return "skipped"
        log.warning("sandbox %s/%s: status still conflicting after retries", ns, name)
        return "skipped"

    def _ended(
        self, phase: str, reason: str, message: str, exit_code: int | None
    ) -> dict[str, Any]:
        status: dict[str, Any] = {
            "phase": phase,
            "reason": reason,
            "message": message,
            "finishedAt": rfc3339(self._clock()),
        }
        if exit_code is not None:
            status["exitCode"] = exit_code
        return status

    def _end_lost(self, key: str) -> None:
        ns, name = key.split("/", 1)
        try:
            obj = self.objects.get_sandbox(ns, name)
        except Exception as exc:
            log.warning("sandbox %s: cannot read it to end it: %s", key, exc)
            return
        log.warning("sandbox %s was Running here but its container is gone", key)
        self._write_status(
            obj,
            self._ended("Stopped", "ContainerLost", f"container gone from node {self.node}", None),
            allowed_from=frozenset({"Running"}),
        )

    # ------------------------------------------------------------ sync: accept, stop, fence

    def sync_once(self) -> None:
        rt = self._rt
        if not (self.sandbox_watch.synced.is_set() and self.node_watch.synced.is_set()):
            return  # no listing yet: an empty map is not "no sandboxes" (their LIST wakes us)
        # Work in flight now may finish before the views below are acted on: their
        # view of its sandbox is then stale (a start that just wrote Running would be
        # seen Scheduled with a container, and torn down), so it waits for the next pass.
        with self._busy_lock:
            in_flight = set(self._busy)
        # Sandboxes first, then containers: a Sandbox seen Running had its container
        # created before its status said so, so the container listing that follows has it.
        sandboxes = self.sandbox_watch.items()
        drained = _unschedulable(self.node_watch.get(self.node))
        containers = rt.list_containers(timeout=self.call_timeout)
        by_key: dict[str, ContainerInfo] = {}
        for c in containers:
            key = c.labels.get(SANDBOX_LABEL)
            if key:
                by_key[key] = c

        phases: dict[str, int] = {}
        seen: set[str] = set()
        for sb in sandboxes:
            key, phase = _key(sb), _phase(sb)
            phases[phase] = phases.get(phase, 0) + 1
            seen.add(key)
            container = by_key.get(key)
            if key in in_flight or self.busy(key):
                continue
            if phase in ("Pending", "Scheduled"):
                if container is not None:
                    self._submit(key, partial(self._teardown_unstarted, key, container))
                elif drained:
                    self._submit(key, partial(self._refuse_drained, sb))
                else:
                    self._submit(key, partial(self.start_sandbox, sb))
            elif phase == "Running":
                if container is None:
                    if (sb.get("status") or {}).get("containerId"):
                        self._submit(key, partial(self._end_lost, key))
                elif drained:
                    self._submit(key, partial(self.stop_sandbox, sb, container, "Drained"))
            elif container is not None:  # terminal: Dead is fenced, Stopped/Failed cleaned up
                if phase == "Dead":
                    log.warning(
                        "sandbox %s was marked Dead: tearing down container %s", key, container.id
                    )
                    self.metrics.fenced.inc()
                self._submit(key, partial(self._teardown, container))
        for phase in ("Pending", "Scheduled", "Running", "Stopped", "Failed", "Dead"):
            self.metrics.sandboxes.labels(phase).set(phases.get(phase, 0))

        for key, container in by_key.items():
            if key not in seen and key not in in_flight and not self.busy(key):
                # Deleted (or moved away, which the API forbids): stop it gracefully.
                self._submit(key, partial(self._stop_deleted, key, container))

    # ------------------------------------------------------------ sandbox network (CNI)

    def _resolve_network_mode(self) -> bool:
        """Whether sandboxes without hostNetwork are attached through CNI."""
        mode = self.settings.network_mode
        if mode is NetworkMode.AUTO:
            try:
                config = load_config(self.settings.cni_conf_dir)
            except NoNetworkConfig as exc:
                log.info("network mode auto: %s: sandboxes report the node's address", exc)
                return False
            log.info("network mode auto: CNI network %s from %s", config.name, config.source)
            return True
        log.info("network mode %s", mode.value)
        return mode is NetworkMode.CNI

    @staticmethod
    def _cni_args(labels: Mapping[str, str], container_id: str) -> dict[str, str]:
        """The Kubernetes CNI_ARGS the kubelet passes too (plugins may key on them)."""
        ns, _, name = labels.get(SANDBOX_LABEL, "").partition("/")
        args = {"K8S_POD_NAMESPACE": ns, "K8S_POD_NAME": name}
        if labels.get(SANDBOX_UID_LABEL):
            args["K8S_POD_UID"] = labels[SANDBOX_UID_LABEL]
        args["K8S_POD_INFRA_CONTAINER_ID"] = container_id
        return {k: v for k, v in args.items() if v}

    def _release_network(self, container: ContainerInfo | str, *, patience: float = -1) -> None:
        """Teardown's hook: CNI DEL and namespace removal, from the container's labels.

        A failure raises (teardown keeps the container, the next pass retries) until
        it has failed for ``patience`` seconds (default ``RELEASE_PATIENCE``; 0 gives
        up at once): then the error is logged naming what may stay allocated, the
        namespace is removed anyway and the teardown goes on.
        """
        if patience < 0:
            patience = RELEASE_PATIENCE
        if isinstance(container, str):
            found = self._rt.list_containers(timeout=self.call_timeout)
            matches = [c for c in found if c.id == container]
            if not matches:
                return
            container = matches[0]
        attachment = Attachment.from_labels(container.id, container.labels)
        if attachment is None:
            return
        try:
            self.network.detach(attachment, self._cni_args(container.labels, container.id))
        except CniError as exc:
            first = self._release_failing_since.setdefault(container.id, time.monotonic())
            if time.monotonic() - first < patience:
                raise
            log.error(
                "container %s: giving up on CNI DEL from network %s after %.0fs; its "
                "address may stay allocated: %s",
                container.id,
                attachment.network,
                time.monotonic() - first,
                exc,
            )
            self.network.netns.delete(attachment.netns_name)
        self._release_failing_since.pop(container.id, None)

    def _teardown(
        self, container: ContainerInfo | str, *, release_patience: float = -1
    ) -> TeardownResult:
        return teardown(
            self._rt,
            container,
            kill_wait=self.kill_wait,
            call_timeout=self.call_timeout,
            on_done=self._count_teardown,
            release=partial(self._release_network, patience=release_patience),
        )

    def _graceful_stop(self, container: ContainerInfo | str, grace: float) -> TeardownResult:
        return stop(
            self._rt,
            container,
            stop_grace=grace,
            kill_wait=self.kill_wait,
            call_timeout=self.call_timeout,
            on_done=self._count_teardown,
            release=self._release_network,
        )

    def _grace(self, sb: Mapping[str, Any]) -> float:
        seconds = (sb.get("spec") or {}).get("terminationGracePeriodSeconds")
        return float(seconds) if seconds is not None else self.settings.stop_grace.total_seconds()

    def _teardown_unstarted(self, key: str, container: ContainerInfo) -> None:
        """Tear down the container of a sandbox the watch shows unstarted (a start that
        failed half-way), once a fresh read agrees.

        The watched view lags the agent's own writes by an event's trip: a start that
        wrote Running just before this pass still looks Scheduled with a container,
        and must not be torn down for it. Rare (only a container beside an unstarted
        sandbox), so the extra read costs nothing when idle.
        """
        ns, name = key.split("/", 1)
        try:
            current = self.objects.get_sandbox(ns, name)
        except Exception as exc:
            if is_not_found(exc):
                self._stop_deleted(key, container)
            else:
                log.warning("sandbox %s: cannot re-read it before a teardown: %s", key, exc)
            return
        if _phase(current) in ("Pending", "Scheduled"):
            self._teardown(container)
        # Otherwise the watch is behind: its event wakes a pass that sees the truth.

    def _stop_deleted(self, key: str, container: ContainerInfo) -> None:
        log.info("sandbox %s is gone: stopping container %s", key, container.id)
        self._graceful_stop(container, self.settings.stop_grace.total_seconds())

    def _refuse_drained(self, sb: Mapping[str, Any]) -> None:
        self._write_status(
            sb,
            self._ended("Stopped", "Drained", f"node {self.node} is drained", None),
            allowed_from=frozenset({"Pending", "Scheduled"}),
        )

    def stop_sandbox(self, sb: Mapping[str, Any], container: ContainerInfo, reason: str) -> None:
        key = _key(sb)
        log.info("sandbox %s: stopping container %s (%s)", key, container.id, reason)
        result = self._graceful_stop(container, self._grace(sb))
        code = result.exit_status.code if result.exit_status else None
        try:
            current = self.objects.get_sandbox(*key.split("/", 1))
        except Exception:
            return  # deleted meanwhile: nothing to record
        self._write_status(
            current, self._ended("Stopped", reason, f"stopped on node {self.node}", code)
        )

    def start_sandbox(self, sb: Mapping[str, Any]) -> None:
        rt = self._rt
        key = _key(sb)
        meta = sb["metadata"]
        image = str((sb.get("spec") or {}).get("image", ""))
        try:
            spec = SandboxSpec.model_validate(sb.get("spec") or {})
        except ValidationError as exc:
            self._fail(sb, "InvalidSpec", f"spec rejected by the agent: {exc}")
            return
        violations = self._policy_violations(sb, spec)
        if violations is None:
            return  # the namespace's level is unknown: the next sync asks again
        if violations:
            self._fail(sb, REASON_POLICY_VIOLATION, describe(violations))
            return
        container_id = container_id_for(meta["uid"])
        try:
            config = rt.image_config(image, timeout=self.call_timeout)
        except NotFound as exc:
            self._fail(sb, "ImageNotFound", f"image {image} is not on node {self.node}: {exc}")
            return
        except RuntimeError_ as exc:
            self._fail(sb, "ImageUnavailable", f"image {image} cannot be read: {exc}")
            return
        try:
            oci = build_oci_spec(
                container_id,
                spec,
                config,
                hostname=meta["name"],
                pids_limit=self.settings.pids_limit or None,
                limit_swap=self.limit_swap,
                node_capabilities=self.node_capabilities,
            )
        except RunAsRootRefused as exc:
            self._fail(sb, REASON_RUN_AS_ROOT, str(exc))
            return
        except ValueError as exc:
            self._fail(sb, "InvalidSpec", str(exc))
            return
        attachment: Attachment | None = None
        if self.cni_enabled and not spec.host_network:
            try:
                attachment = self.network.plan(container_id)
            except CniError as exc:
                self._fail(sb, REASON_NETWORK_SETUP_FAILED, str(exc))
                return
            join_netns(oci, attachment.netns_path)
        labels = {SANDBOX_LABEL: key, SANDBOX_UID_LABEL: meta["uid"]}
        if attachment is not None:
            labels.update(attachment.labels())
        log_path = ""
        if self.settings.log_dir:
            directory = Path(self.settings.log_dir)
            with contextlib.suppress(OSError):
                directory.mkdir(parents=True, exist_ok=True)
            log_path = str(directory / f"{meta['namespace']}_{meta['name']}_{meta['uid']}.log")
        try:
            created = rt.create_container(
                ContainerSpec(
                    id=container_id,
                    image=image,
                    oci_spec=oci,
                    labels=labels,
                    log_path=log_path,
                ),
                timeout=self.call_timeout,
            )
        except NotFound as exc:
            self._fail(
                sb, "ImageNotFound", f"image {image} is not usable on node {self.node}: {exc}"
            )
            return
        except RuntimeError_ as exc:
            if exc.code == "already_exists":
                log.warning("sandbox %s: container %s exists: tearing it down", key, container_id)
                self._teardown(container_id)  # the next sync starts it afresh
                return
            self._fail(sb, "CreateFailed", f"cannot create a container from image {image}: {exc}")
            return
        ip = self.address
        if attachment is not None:
            # Before the task: the sandbox never runs without its address.
            try:
                result = self.network.attach(attachment, self._cni_args(labels, container_id))
            except CniError as exc:
                # One DEL for what a partial chain made; plugins undo their own failed
                # ADD, and a configuration that cannot ADD cannot DEL either.
                self._teardown(created, release_patience=0)
                self._fail(sb, REASON_NETWORK_SETUP_FAILED, str(exc))
                return
            ip = result.primary_ip(attachment.ifname) or ip
        try:
            task = rt.start_task(container_id, log_path=log_path, timeout=self.call_timeout)
        except RuntimeError_ as exc:
            self._teardown(created)
            self._fail(sb, "StartFailed", f"container {container_id} did not start: {exc}")
            return
        if self.collector is not None:
            self.collector.touch_image(image)
        status = {
            "phase": "Running",
            "reason": "Started",
            "message": f"running on node {self.node}",
            "containerId": container_id,
            "pid": task.pid,
            "ip": ip,
            "startedAt": rfc3339(self._clock()),
        }
        outcome = self._write_status(sb, status, allowed_from=frozenset({"Pending", "Scheduled"}))
        if outcome == "written":
            log.info("sandbox %s running: container %s pid %d", key, container_id, task.pid)
        else:
            log.info("sandbox %s was %s while starting: tearing its container down", key, outcome)
            self._teardown(created)

    def _policy_violations(
        self, sb: Mapping[str, Any], spec: SandboxSpec
    ) -> list[Violation] | None:
        """The rules of the namespace's level this spec breaks; None if the level is unknown.

        Defence in depth behind the admission policy. A spec that fits
        ``restricted`` fits every level, so its namespace is not even read.
        """
        ns = sb["metadata"]["namespace"]
        if not check(spec, Level.RESTRICTED, ns):
            return []
        try:
            labels = namespace_labels(self.objects.api, ns)
        except Exception as exc:
            log.warning(
                "sandbox %s: cannot read namespace %s for its policy level: %s", _key(sb), ns, exc
            )
            return None
        return check(spec, level_of(labels, self.settings.default_policy_level), ns)

    def _fail(self, sb: Mapping[str, Any], reason: str, message: str) -> None:
        log.warning("sandbox %s failed: %s: %s", _key(sb), reason, message)
        self._write_status(sb, self._ended("Failed", reason, message, None))

    # ------------------------------------------------------------ reaper

    def reap_once(self) -> int:
        """Tear down containers whose task provably exited; end their Sandboxes. Returns count."""
        rt = self._rt
        self.metrics.reaper_passes.inc()
        tasks = {t.container_id: t for t in rt.list_tasks(timeout=self.call_timeout)}
        containers = rt.list_containers(timeout=self.call_timeout)
        reaped = 0
        for c in containers:
            task = tasks.get(c.id)
            if task is None or task.state != TaskState.STOPPED:
                continue  # running, unknown (a silent shim), or not started: never touched
            key = c.labels.get(SANDBOX_LABEL) or f"container/{c.id}"
            if self._submit(key, partial(self._reap, key, c, task)):
                reaped += 1
        return reaped

    def _oom_kills(self, container_id: str) -> int | None:
        try:
            return oom_kills(self.settings.cgroup_root, cgroups_path_for(container_id))
        except Exception as exc:  # a guess about the reason must never stop the reaper
            log.warning("cannot read the OOM counter of %s: %s", container_id, exc)
            return None

    def _reap(self, key: str, container: ContainerInfo, task: TaskInfo) -> None:
        # Before the teardown: deleting the task removes the cgroup and its counter.
        oom = self._oom_kills(container.id)
        result = self._teardown(container)
        self.metrics.reaped.inc()
        code = task.exit_status
        if code is None and result.exit_status is not None:
            code = result.exit_status.code
        log.info("reaper: container %s of %s exited with %s", container.id, key, code)
        if "/" not in key or key.startswith("container/"):
            return
        try:
            sb = self.objects.get_sandbox(*key.split("/", 1))
        except Exception:
            return
        if (sb.get("status") or {}).get("containerId") not in (None, container.id):
            return
        if oom:
            phase = "Stopped" if _phase(sb) == "Running" else "Failed"
            message = f"killed by the kernel for exceeding its memory limit (exit code {code})"
            status = self._ended(phase, REASON_OOM_KILLED, message, code)
        elif _phase(sb) == "Running":
            status = self._ended("Stopped", "Exited", f"exited with code {code}", code)
        else:
            status = self._ended("Failed", "ExitedBeforeRunning", f"exited with code {code}", code)
        self._write_status(sb, status)

    # ------------------------------------------------------------ image GC and CachePrune

    def _record_gc(self, result: GcResult) -> None:
        if not result.ran:
            return
        try:
            self.objects.patch_node_status(self.node, {"gc": result.to_node_gc_status().wire()})
        except Exception as exc:
            log.warning("cannot record GC state in SandboxNode %s: %s", self.node, exc)

    def gc_once(self) -> None:
        if self.collector is None:
            return
        self._record_gc(self.collector.run_automatic())

    def prune_once(self) -> int:
        """Answer CachePrune requests for this node that it has not answered yet."""
        if self.collector is None or not self.prune_watch.synced.is_set():
            return 0
        answered = 0
        requests = self.prune_watch.items()
        # The watch shows an answer only once its event is back: until then this set
        # keeps a request from running twice. Bounded by the requests that exist.
        self._answered_prunes &= {str(r["metadata"].get("uid")) for r in requests}
        for request in requests:
            if str(request["metadata"].get("uid")) in self._answered_prunes:
                continue
            spec = request.get("spec") or {}
            nodes = spec.get("nodes") or []
            status = request.get("status") or {}
            results = status.get("results") or {}
            if (nodes and self.node not in nodes) or self.node in results:
                continue
            if status.get("phase") not in (None, "Pending") and self.node not in (
                status.get("targets") or []
            ):
                continue  # resolved before this node registered: nobody waits for it
            name = request["metadata"]["name"]
            kind = pass_for_request(bool(spec.get("all")))
            log.info("CachePrune %s: running the %s pass", name, kind)
            if spec.get("target", "containerd") != "containerd":
                body: dict[str, Any] = {
                    "pass": kind,
                    "error": f"unknown target {spec.get('target')!r}",
                    "completedAt": rfc3339(self._clock()),
                }
            else:
                result = self.collector.run(kind)
                self._record_gc(result)
                body = result.to_prune_result(self._clock()).wire()
            patch_cacheprune_result(self.objects, name, self.node, body)
            self._answered_prunes.add(str(request["metadata"].get("uid")))
            answered += 1
        return answered


def run(settings: AgentSettings, kubeconfig: str | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT (sandboxes keep running after it exits)."""
    from sandlot.adapters.kube import load_api_client

    api = load_api_client(kubeconfig)
    agent = Agent(settings, api)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down (sandboxes keep running)", signum)
        agent.request_stop()

    for sig in (signals.SIGTERM, signals.SIGINT):
        signals.signal(sig, on_signal)
    try:
        return agent.run_forever()
    finally:
        api.close()


__all__ = ["Agent", "RunAsRootRefused", "build_oci_spec", "container_id_for", "run"]
