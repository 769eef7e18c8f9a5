"""Scale of one operator replica: N nodes, M sandboxes, the real operator.

A private control plane; N SandboxNodes whose Leases one process renews (as N
agents would, no containerd); M Running Sandboxes spread evenly over them (the API server writes the
first, the
rest are its stored copies loaded into etcd: ``scalefleet.load_sandboxes``); the real
``sandlot operator`` as a subprocess. Every figure is a ratio or a per-unit figure
measured in this one run:

1. start-up on M existing sandboxes: time from the process's start to its first
   node decision and to every node's, peak RSS (VmHWM);
2. steady RSS per sandbox and per node (fresh operators: empty, nodes only (the
   second one, which finds the nodes' status written), the whole fleet), idle CPU over one resync
   interval, and the operator's API
   requests per second at rest beyond its watches and leader-lease renewals (the
   API server's audit log of the operator's own user, so kopf's requests count too);
3. reaction: one node of M/N sandboxes stops renewing -> the last Dead seen on a
   watch, minus its deadline (renewal + lease duration + grace); 10 % of the nodes
   at once, the mass-failure guard off and then on -> the last node's decision and
   the last mark, after their deadlines;
4. marking at the API server's limit, ``--mark-runs`` paired runs: one node of
   ``--mark-sandboxes`` lost; deadline -> last Dead, over the time a bare client
   takes to patch the same sandboxes' status as a mark does (phase, reason,
   message, finishedAt, the Ready condition) on the same API server right after.

    .venv/bin/python bench/scale.py                 # M=15,000 / N=500 (make bench)
    .venv/bin/python bench/scale.py --full          # M=150,000 / N=5,000
    .venv/bin/python bench/scale.py --sandboxes 1000 --nodes 50 --mark-runs 1
    .venv/bin/python bench/scale.py --nodes 5000 --sandboxes 5000 --rest-only
    .venv/bin/python bench/scale.py --full --mark-only   # 4. alone, on the whole fleet
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from tests.support.kube import start_private_plane
from tests.support.operator import OperatorProcess

from bench.gotrace import GoGcTrace, spent_in
from bench.kopffloor import TimerFloor
from bench.nodehealth import cpu_seconds, rss_kb, settle
from bench.scalefleet import (
    Agents,
    BarePatches,
    DeadWatch,
    LeaseReader,
    OperatorRequests,
    bare_marking,
    bare_patches,
    create_nodes,
    create_sandboxes,
    load_sandboxes,
    operator_identity,
    operator_kubeconfig,
)
from bench.scaleplot import write_plot
from sandlot.adapters.kube import load_api_client
from sandlot.api import GROUP, VERSION
from sandlot.api.timestamps import parse_time
from sandlot.controllers.marking import FIRST_PAGE_PER_WRITER

NS = "scale"
LEASE_NS = "sandlot-system"
GRACE = 5.0
RESYNC = 30.0  # the chart's default resync interval
TIMERS_PER_S = 10.0  # node timers a second at most, as docs/capacity.md advises (past 300 nodes)
MARK_CONCURRENCY = 16
# The operator's first page of a lost node's sandboxes at that concurrency.
FIRST_PAGE = FIRST_PAGE_PER_WRITER * MARK_CONCURRENCY
FIRST_DECISION = PASSES = "sandlot_operator_node_reconcile_duration_seconds_count"
PASS_SECONDS = "sandlot_operator_node_reconcile_duration_seconds_sum"


class LoadSampler:
    """The machine's 1-minute load average, sampled every 30 s while the run lasts:
    every figure here shares 2 cores with the API server and etcd."""

    def __init__(self) -> None:
        self.low = self.high = os.getloadavg()[0]
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(30):
            now = os.getloadavg()[0]
            self.low, self.high = min(self.low, now), max(self.high, now)

    def stop(self) -> None:
        self._stop.set()


APISERVER = "kube-apiserver"
CPU_SAMPLE = 0.02  # seconds between a CpuTrace's samples


class CpuTrace:
    """Samples the CPU seconds of named processes every ``CPU_SAMPLE`` seconds on a
    thread, so the CPU of a window known only afterwards (deadline -> last mark
    seen) can be read back: each window is widened to the samples around it, by at
    most one sample at each end."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-trace", daemon=True)

    def __enter__(self) -> CpuTrace:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> None:
        cpu = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                cpu[name] = cpu_seconds(pid)
        self.samples.append((time.time(), cpu))

    def _run(self) -> None:
        while not self._stop.wait(CPU_SAMPLE):
            self._sample()

    def spent(self, began: float, ended: float) -> dict[str, float]:
        """CPU seconds of each process from ``began`` to ``ended`` (epoch seconds),
        waiting (bounded) for the sample after ``ended``."""
        deadline = time.monotonic() + 5
        while self.samples[-1][0] < ended and time.monotonic() < deadline:
            time.sleep(CPU_SAMPLE)
        before = [c for t, c in self.samples if t <= began] or [self.samples[0][1]]
        after = [c for t, c in self.samples if t >= ended] or [self.samples[-1][1]]
        first, last = before[-1], after[0]
        return {name: last[name] - first[name] for name in first if name in last}


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each of the process's threads, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    seen = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        seen[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return seen


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class Scale:
    def __init__(self, work: Path, nodes: int, sandboxes: int, renew_every: float) -> None:
        self.work = work
        self.n, self.m = nodes, sandboxes
        self.every = renew_every
        self.duration = max(round(3 * renew_every), 2)
        # Deadlines are met by each node's own wake-up; the resync timer is the safety
        # net, and each tick costs the operator CPU: what to set for a large fleet.
        self.resync = max(RESYNC, nodes / TIMERS_PER_S)
        self.view_since: datetime | None = None  # when the running operator listed the Leases
        flags = operator_identity(work / "cp")
        # The API server's garbage collector, cycle by cycle, in its log: on 2 cores a
        # cycle takes a visible share of a marking window (``GoGcTrace``).
        self.plane = start_private_plane(
            work / "cp",
            extra_flags=flags,
            namespaces=(NS, LEASE_NS),
            apiserver_env={"GODEBUG": "gctrace=1"},
        )
        self.apiserver_gc = GoGcTrace(
            work / "cp" / f"{APISERVER}.log", self.plane.pids()[APISERVER]
        )
        self.op_kubeconfig = operator_kubeconfig(self.plane, work / "operator.kubeconfig")
        self.kubeconfig = str(self.plane.kubeconfig)
        self.api = load_api_client(self.kubeconfig, pool_size=32, request_timeout=(30.0, 120.0))
        self.objs: Any = client.CustomObjectsApi(self.api)
        self.requests = OperatorRequests(work / "cp" / "audit.log")
        self.rows: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {"nodes": nodes, "sandboxes": sandboxes}
        self.nodes = [f"n{i:05d}" for i in range(nodes)]
        self.agents: Agents | None = None
        self.watch: DeadWatch | None = None
        self.placed: dict[str, list[str]] = {n: [] for n in self.nodes}
        self.lost: set[str] = set()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.agents is not None:
            self.agents.stop()
        self.api.close()
        self.plane.stop()

    def row(self, name: str, value: float, target: str, ok: bool, detail: str) -> None:
        self.rows.append(
            {"benchmark": name, "value": round(value, 4), "target": target, "ok": ok,
             "detail": detail}
        )  # fmt: skip
        verdict = "ok" if ok else "MISSED"
        print(f"  {name}: {value:.4g} (target {target}) {verdict} - {detail}", flush=True)

    def operator(self, *flags: str) -> OperatorProcess:
        lease_view = min(45.0, (self.duration + GRACE) / 2)
        return OperatorProcess(
            self.plane,
            self.work,
            LEASE_NS,
            "--grace-period", f"{GRACE:g}s",
            "--agent-lease-duration", f"{self.duration}s",
            "--lease-view-max-age", f"{lease_view:g}s",
            "--resync-interval", f"{self.resync:g}s",
            "--mark-concurrency", str(MARK_CONCURRENCY),
            *flags,
            kubeconfig=self.op_kubeconfig,
        )  # fmt: skip

    # -- memory ---------------------------------------------------------------------

    def baseline(self) -> None:
        """RSS of a fresh operator on an empty cluster, then on the nodes alone."""
        op = self.operator()
        try:
            op.wait_metrics(120)
            settle(op.proc.pid, timeout=600)
            self.figures["rss_empty_kb"] = rss_kb(op.proc.pid)
        finally:
            op.stop()
        self.add_nodes()
        # The first operator on the nodes writes each one's status once (threads,
        # arenas, buffers it keeps): a first install's operator. The second finds
        # them written, as every later start does, and is the one the steady rows use.
        for first in (True, False):
            op = self.operator()
            try:
                op.wait_metrics(120)
                settle(op.proc.pid, timeout=600)
                rss, peak = rss_kb(op.proc.pid), peak_kb(op.proc.pid)
            finally:
                op.stop()
            if first:
                self.figures.update(rss_first_kb=rss, peak_first_kb=peak)
                self.row(f"first start on {self.n} new nodes: peak RSS (MB)",
                         peak * 1.024 / 1000, "report", True,
                         f"VmHWM of the operator that writes every node's first status "
                         f"(the one a first install runs); RSS once quiet "
                         f"{rss * 1.024 / 1000:.1f} MB")  # fmt: skip
            else:
                self.figures["rss_nodes_kb"] = rss

    def add_nodes(self) -> None:
        """The N SandboxNodes, and the process that renews their Leases."""
        started = time.monotonic()
        create_nodes(self.kubeconfig, self.nodes)
        self.agents = Agents(self.kubeconfig, LEASE_NS, self.nodes, self.work, self.every,
                             self.duration)  # fmt: skip
        print(f"  {self.n} nodes and leases in {time.monotonic() - started:.1f}s", flush=True)

    def populate(self) -> None:
        per = self.m // self.n
        placed = [(f"s-{n}-{i}", n) for n in self.nodes for i in range(per)]
        for name, node in placed:
            self.placed[node].append(name)
        self.m = self.figures["sandboxes"] = len(placed)  # M rounded down to N's multiple
        took = load_sandboxes(self.plane, NS, placed)
        self.figures["create_seconds"] = took
        print(f"  {len(placed)} Running sandboxes loaded and listed in {took:.1f}s",
              flush=True)  # fmt: skip

    # -- start-up and rest ----------------------------------------------------------

    def start(self, *flags: str) -> OperatorProcess:
        began = time.monotonic()
        op = self.operator(*flags)
        first = every = None
        deadline = began + 1800
        while every is None and time.monotonic() < deadline:
            if op.proc.poll() is not None:
                raise RuntimeError(f"operator exited {op.proc.returncode}:\n{op.log()}")
            try:
                count = op.metric(FIRST_DECISION)
            except OSError:
                count = 0.0
            now = time.monotonic()
            if count > 0 and first is None:
                first = now - began
            if count >= self.n:
                every = now - began
            time.sleep(0.05)
        if first is None or every is None:
            raise TimeoutError(f"operator decided on {count:.0f} of {self.n} nodes in 1800s")
        # Every node decided: this operator has listed the Leases. A Lease it listed
        # counts as renewed at the listing (its own clock, erring towards life), so a
        # node lost before renewing once more would get a later deadline than the
        # bench's; `lose` waits for that renewal.
        self.view_since = datetime.now(UTC)
        settle(op.proc.pid, timeout=1800)
        settled = time.monotonic() - began
        if "peak_kb" not in self.figures:  # the start-up measured is the first one
            self.figures.update(first_decision_s=first, all_decisions_s=every, settled_s=settled)
            self.figures["peak_kb"] = peak_kb(op.proc.pid)
        else:  # a restart on the same fleet, its nodes' status already written
            peak = peak_kb(op.proc.pid)
            self.figures.update(restart_first_decision_s=first, restart_peak_kb=peak)
            self.row("restart: first node decision (s)", first, "report", True,
                     f"every node decided after {every:.1f}s, CPU quiet after {settled:.1f}s, "
                     f"peak RSS {peak / 1024 * 1.048576:.1f} MB")  # fmt: skip
        return op

    def startup(self) -> OperatorProcess:
        print(f"start-up on {self.m} sandboxes over {self.n} nodes", flush=True)
        op = self.start("--min-nodes-for-guard", str(10**6))  # guard off
        f = self.figures
        peak_mb = f["peak_kb"] / 1024
        self.row("start-up: first node decision (s)", f["first_decision_s"], "report", True,
                 f"every node decided after {f['all_decisions_s']:.1f}s, CPU quiet after "
                 f"{f['settled_s']:.1f}s")  # fmt: skip
        self.row(f"start-up peak RSS (MB), {self.m} sandboxes", peak_mb * 1.048576,
                 "< 500 (at 150k)", peak_mb * 1.048576 < 500,
                 "VmHWM of the operator process")  # fmt: skip
        return op

    def rest(self, op: OperatorProcess) -> None:
        pid = op.proc.pid
        rss = rss_kb(pid)
        f = self.figures
        f["rss_full_kb"] = rss
        per_node = (f["rss_nodes_kb"] - f["rss_empty_kb"]) / self.n
        per_sb = (rss - f["rss_nodes_kb"]) / self.m
        f.update(per_node_kb=per_node, per_sandbox_kb=per_sb)
        # The floors beside it: kopf alone ticking the same timers (started first: its
        # start-up burst must be over), and a bare reader of the same Lease watch.
        timers = TimerFloor(self.kubeconfig, self.resync, self.n, timeout=600)
        settle(timers.proc.pid, timeout=600)
        reader = LeaseReader(self.kubeconfig, LEASE_NS)
        try:
            assert self.agents is not None
            renewed0 = self.agents.command("count")["renewals"]
            floor0 = cpu_seconds(reader.proc.pid)
            kopf0 = cpu_seconds(timers.proc.pid)
            passes0, spent0 = op.metric(PASSES), op.metric(PASS_SECONDS)
            threads0 = thread_cpu(pid)
            cpu0, t0, w0 = cpu_seconds(pid), time.monotonic(), time.time()
            time.sleep(self.resync)  # one resync interval: every node's timer fires once
            cpu1, t1, w1 = cpu_seconds(pid), time.monotonic(), time.time()
            threads1 = thread_cpu(pid)
            passes, spent = op.metric(PASSES) - passes0, op.metric(PASS_SECONDS) - spent0
            floor1 = cpu_seconds(reader.proc.pid)
            kopf1 = cpu_seconds(timers.proc.pid)
            renewed = self.agents.command("count")["renewals"] - renewed0
        finally:
            read = reader.stop()
            ticked = timers.stop()
        time.sleep(2)  # the audit log is written in batches, a second apart
        window = t1 - t0
        seen = self.requests.read(w0, w1)
        # Beyond the watches and lease renewals (the leader election's, one replica's).
        renewals = sum(v for k, v in seen.items() if k[1] == "leases")
        rest = {k: v for k, v in seen.items() if k[1] != "leases"}
        beyond = sum(rest.values())
        per_s = beyond / window
        per_1000 = per_s / (self.n / 1000)
        idle = (cpu1 - cpu0) / window
        floor = (floor1 - floor0) / window
        kopf_floor = (kopf1 - kopf0) / window
        if renewed <= 0 or read <= 0:
            raise RuntimeError(f"no renewals in the idle window ({renewed} made, {read} read)")
        f.update(idle_cpu=idle, rest_rps=per_s, rest_rps_per_1000_nodes=per_1000,
                 idle_floor_cpu=floor, idle_kopf_floor_cpu=kopf_floor,
                 renewals_per_s=renewed / window,
                 timers_per_s=self.n / self.resync)  # fmt: skip
        self.row("steady RSS per sandbox (KB)", per_sb, "< 3", per_sb < 3,
                 f"RSS {f['rss_empty_kb'] / 1024:.0f} MiB empty, {f['rss_nodes_kb'] / 1024:.0f} "
                 f"MiB with {self.n} nodes, {rss / 1024:.0f} MiB with {self.m} sandboxes")  # fmt: skip
        self.row("steady RSS per node (KB)", per_node, "report", True,
                 f"({f['rss_nodes_kb']} - {f['rss_empty_kb']}) KB / {self.n} nodes")  # fmt: skip
        self.row("idle CPU (cores)", idle, "< 0.05", idle < 0.05,
                 f"over {window:.0f}s (one resync interval), nothing changing but "
                 f"{renewed / window:.0f} Lease renewals/s and {self.n / self.resync:.0f} "
                 f"node timers/s; a bare reader of the same Lease watch: {floor:.3f} cores "
                 f"({read} events)")  # fmt: skip
        both = floor + kopf_floor
        self.row("idle CPU floor: Lease reader + kopf timers (cores)", both, "report", True,
                 f"{floor:.4f} + {kopf_floor:.4f}: the bare reader, and kopf alone ticking "
                 f"the same {self.n} timers every {self.resync:g}s ({ticked} ticks in all) "
                 f"with a handler that does nothing; the operator is {idle - both:.4f} "
                 f"cores above it")  # fmt: skip
        loop_cpu = (threads1.get(pid, 0.0) - threads0.get(pid, 0.0)) / window
        f.update(idle_loop_cpu=loop_cpu, passes_per_s=passes / window)
        self.row("idle CPU of the event loop's thread (cores)", loop_cpu, "report", True,
                 f"{passes / window:.1f} node passes/s, {1000 * spent / max(passes, 1):.2f} ms "
                 f"each (their own timing); the other threads (Lease watch, leader "
                 f"election, writes): {idle - loop_cpu:.4f} cores")  # fmt: skip
        self.row("idle CPU per Lease renewal (ms)", 1000 * (idle * window) / renewed, "report",
                 True, f"the operator's CPU at rest over the renewals it read; the bare "
                 f"reader's: {1000 * (floor * window) / max(read, 1):.3f} ms an event")  # fmt: skip
        detail = ", ".join(f"{v} {k[0]} {k[1]}" for k, v in sorted(rest.items()) if v > 0)
        self.row("API requests/s at rest per 1,000 nodes", per_1000, "< 1", per_1000 < 1,
                 f"the operator's requests in {window:.0f}s (audit log): {beyond} beyond "
                 f"watches and its {renewals} leader-lease requests: {detail or 'none'}")  # fmt: skip

    # -- reaction -------------------------------------------------------------------

    def lose(self, nodes: list[str]) -> tuple[dict[str, datetime], dict[str, float]]:
        """Stop renewing ``nodes``; wait until their sandboxes are seen Dead.
        Returns each node's deadline and each sandbox's Dead time (epoch seconds)."""
        assert self.agents is not None and self.watch is not None
        self.lost.update(nodes)
        if self.view_since is not None:
            self.agents.renewed_after(nodes, self.view_since, timeout=2 * self.every + 60)
        last = self.agents.pause(nodes)
        grace = timedelta(seconds=self.duration + GRACE)
        deadlines = {n: t + grace for n, t in last.items()}
        names = [s for n in nodes for s in self.placed[n]]
        seen = self.watch.wait(names, timeout=self.duration + GRACE + 120 + len(names) / 10)
        return deadlines, seen

    def recover(self, nodes: list[str]) -> None:
        assert self.agents is not None
        self.agents.command("resume", nodes)

    def handled_at(self, node: str) -> datetime:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = self.objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)
            handled = ((body.get("status") or {}).get("health") or {}).get("handledAt")
            if handled:
                t = parse_time(handled)
                assert t is not None
                return t
            time.sleep(0.1)
        raise TimeoutError(f"node {node} never recorded handledAt")

    def fresh_nodes(self, count: int) -> list[str]:
        free = [n for n in self.nodes if n not in self.lost]
        step = max(len(free) // count, 1)
        return free[::step][:count]

    def reaction_one(self) -> None:
        (node,) = self.fresh_nodes(1)
        deadlines, seen = self.lose([node])
        late = max(seen.values()) - deadlines[node].timestamp()
        decided = (self.handled_at(node) - deadlines[node]).total_seconds()
        listing = self.node_listing_seconds()
        self.figures.update(react_one_s=late, node_listing_s=listing)
        self.row(f"one node of {len(seen)} lost: last Dead - deadline (s)", late, "< 1",
                 late < 1, f"decision {decided:.3f}s after the deadline (lease "
                 f"{self.duration}s + grace {GRACE:g}s); the API server's listing of one "
                 f"node's sandboxes by spec.nodeName, the pass's first step: {listing:.3f}s "
                 f"(median of 3, a bare client, right after)")  # fmt: skip
        self.recover([node])

    def node_listing_seconds(self) -> float:
        """Seconds the API server takes to list one node's sandboxes by their
        spec.nodeName (a selectable field: it scans every sandbox), median of 3."""
        took = []
        for node in self.fresh_nodes(3):
            start = time.perf_counter()
            answer = self.objs.list_cluster_custom_object(
                GROUP, VERSION, "sandboxes", field_selector=f"spec.nodeName={node}",
                _preload_content=False,
            )  # fmt: skip
            answer.read()
            took.append(time.perf_counter() - start)
        return statistics.median(took)

    def reaction_many(self, guard: str) -> None:
        lost = self.fresh_nodes(max(self.n // 10, 1))
        deadlines, seen = self.lose(lost)
        decisions = [(self.handled_at(n) - deadlines[n]).total_seconds() for n in lost]
        node_of = {s: n for n in lost for s in self.placed[n]}
        late = [t - deadlines[node_of[s]].timestamp() for s, t in seen.items()]
        self.figures[f"react_10pct_{guard}_decision_s"] = max(decisions)
        self.figures[f"react_10pct_{guard}_last_mark_s"] = max(late)
        self.row(f"10% of nodes lost, guard {guard}: last mark - its deadline (s)", max(late),
                 "report", True, f"{len(lost)} nodes, {len(seen)} sandboxes; decisions "
                 f"{min(decisions):.3f}..{max(decisions):.3f}s after their deadlines; each renewed "
                 f"once after this operator listed the Leases")  # fmt: skip
        self.recover(lost)

    # -- marking at the API server's limit --------------------------------------------

    def marking(self, runs: int, count: int, op: OperatorProcess) -> None:
        print(f"marking at the limit: {runs} paired runs of 1 node x {count} sandboxes",
              flush=True)  # fmt: skip
        assert self.agents is not None and self.watch is not None
        ratios, throughputs, controls, matched = [], [], [], []
        passes, against_pass, pass_throughputs = [], [], []
        pids = {"operator": op.proc.pid, **self.plane.pids()}
        spent: dict[str, list[float]] = {"operator": [], "bare": [], "api_op": [], "api_bare": [],
                                         "gc_op": [], "gc_bare": [], "api_pass": [], "gc_pass": []}  # fmt: skip
        for run in range(runs):
            node = f"mark-{run}"
            create_nodes(self.kubeconfig, [node])
            self.agents.command("add", [node])
            names = [f"m{run}-{i}" for i in range(count)]
            self.placed[node] = names
            create_sandboxes(self.kubeconfig, NS, [(s, node) for s in names], processes=2)
            time.sleep(self.duration)  # the node is seen Ready, and its fresh sandboxes
            with CpuTrace(pids) as trace:
                deadlines, seen = self.lose([node])
                start = deadlines[node].timestamp()
                marked = trace.spent(start, max(seen.values()))
                patched = self.bare_patches(names)
                bare_run = trace.spent(patched.began, patched.ended)
                # The same writes with the requests a marking pass must make first: the
                # node's listings, which the bare patches above do not.
                passed = self.bare_marking(node)
                pass_run = trace.spent(passed.began, passed.ended)
                # The control: the bare client against itself, paired the same way
                # (the first window after the same quiet time as the deadline's, the
                # second right after it). What its ratio moves by, the machine and the
                # API server move by alone.
                time.sleep(self.duration + GRACE)
                quiet = self.bare_patches(names, "control, after the quiet")
                again = self.bare_patches(names, "control, right after")
            took = max(seen.values()) - start
            first = min(seen.values()) - start
            bare = patched.seconds
            spent["operator"].append(marked["operator"] / count)
            spent["bare"].append(patched.cpu / count)
            spent["api_op"].append(marked.get(APISERVER, 0.0) / count)
            spent["api_bare"].append(bare_run.get(APISERVER, 0.0) / count)
            cycles = self.apiserver_gc.cycles()  # the log read once for both windows
            gc_op = spent_in(cycles, start, max(seen.values()))
            gc_bare = spent_in(cycles, patched.began, patched.ended)
            spent["gc_op"].append(gc_op[1] / count)
            spent["gc_bare"].append(gc_bare[1] / count)
            gc_pass = spent_in(cycles, passed.began, passed.ended)
            spent["api_pass"].append(pass_run.get(APISERVER, 0.0) / count)
            spent["gc_pass"].append(gc_pass[1] / count)
            passes.append(passed.seconds / bare)
            against_pass.append(took / passed.seconds)
            pass_throughputs.append(
                (count / (max(seen.values()) - min(seen.values()))) / (count / passed.seconds)
            )
            ratios.append(took / bare)
            throughputs.append((count / (max(seen.values()) - min(seen.values()))) / (count / bare))
            controls.append(again.seconds / quiet.seconds)
            matched.append(took / quiet.seconds)
            etcd = (marked.get("etcd", 0.0) / count, bare_run.get("etcd", 0.0) / count)
            print(f"    run {run}: deadline -> last Dead {took:.3f}s (first {first:.3f}s), "
                  f"bare {bare:.3f}s, ratio {took / bare:.3f}; CPU a mark: operator "
                  f"{spent['operator'][-1] * 1e3:.2f} ms, API server "
                  f"{spent['api_op'][-1] * 1e3:.2f} ms; a bare patch: client "
                  f"{spent['bare'][-1] * 1e3:.2f} ms, API server "
                  f"{spent['api_bare'][-1] * 1e3:.2f} ms; the API server's GC: {gc_op[0]} cycles "
                  f"{gc_op[1]:.2f} CPU-s in the operator's window, {gc_bare[0]} cycles "
                  f"{gc_bare[1]:.2f} CPU-s in the bare one; etcd {etcd[0] * 1e3:.2f} / "
                  f"{etcd[1] * 1e3:.2f} ms a write; a bare marking pass {passed.seconds:.3f}s "
                  f"(API server {spent['api_pass'][-1] * 1e3:.2f} ms a write, GC {gc_pass[0]} "
                  f"cycles {gc_pass[1]:.2f} CPU-s); throughput {throughputs[-1]:.3f}; the "
                  f"control {controls[-1]:.3f} ({quiet.seconds:.3f}s after the quiet, "
                  f"{again.seconds:.3f}s right after); the bench's own watch resumed "
                  f"{self.watch.rewatches} times, listed again {self.watch.relists}",
                  flush=True)  # fmt: skip
        med = statistics.median(ratios)
        self.figures.update(mark_ratio=med, mark_throughput=statistics.median(throughputs))
        self.row(f"deadline -> last mark of {count} / (N / bare rate), median of {runs}", med,
                 "<= 1.1", med <= 1.1, "runs " + ", ".join(f"{r:.2f}" for r in ratios))  # fmt: skip
        worst = min(throughputs)
        at = throughputs.index(worst)
        self.row("marking throughput operator / bare, worst run", worst, ">= 0.8",
                 worst >= 0.8, "runs " + ", ".join(f"{r:.2f}" for r in throughputs) +
                 f"; in the worst the API server's GC took {spent['gc_op'][at] * 1e3:.2f} ms a "
                 f"mark against {spent['gc_bare'][at] * 1e3:.2f} ms a bare patch")  # fmt: skip
        control = min(controls)
        self.figures.update(mark_control_worst=control)
        self.row("control: bare client / itself, paired the same way, worst run", control,
                 "report", True, f"its first window after {self.duration + GRACE:g}s quiet as "
                 "the deadline's is, its second right after, so the ratio moves only with the "
                 "machine and the API server: runs " + ", ".join(f"{r:.2f}" for r in controls))  # fmt: skip
        # The operator's window follows a quiet time, the bare client's does not; the
        # control's first window follows the same quiet. On a large API server heap a
        # garbage collection falls in the first burst of writes after a quiet time.
        self.figures.update(mark_matched=statistics.median(matched))
        self.row("deadline -> last mark / the bare client's time after the same quiet, "
                 f"median of {runs}", statistics.median(matched), "report", True,
                 "the operator against the control's first window, both after "
                 f"{self.duration + GRACE:g}s without writes: runs "
                 + ", ".join(f"{r:.2f}" for r in matched))  # fmt: skip
        # What a marking pass must ask for beyond the writes (the node's first page
        # and its whole listing), measured by a bare client making those requests.
        self.figures.update(mark_pass_share=statistics.median(passes),
                            mark_against_pass=statistics.median(against_pass))  # fmt: skip
        self.row(f"a bare marking pass / bare patches, median of {runs}",
                 statistics.median(passes), "report", True,
                 f"the same {count} writes with the node's first page of {FIRST_PAGE} and its "
                 "whole listing by spec.nodeName first, right after the bare patches: runs "
                 + ", ".join(f"{r:.2f}" for r in passes))  # fmt: skip
        self.row(f"deadline -> last mark / a bare marking pass, median of {runs}",
                 statistics.median(against_pass), "report", True,
                 "the operator against a bare client making the same listings and writes: runs "
                 + ", ".join(f"{r:.2f}" for r in against_pass) + "; the API server's CPU a write "
                 f"in the pass {statistics.median(spent['api_pass']) * 1e3:.2f} ms, its GC "
                 f"{statistics.median(spent['gc_pass']) * 1e3:.2f} ms")  # fmt: skip
        self.figures.update(mark_pass_throughput_worst=min(pass_throughputs))
        self.row("marking throughput operator / a bare marking pass, worst run",
                 min(pass_throughputs), "report", True,
                 "first to last mark against the bare pass's writes with its listings: runs "
                 + ", ".join(f"{r:.2f}" for r in pass_throughputs))  # fmt: skip
        # Where the time goes: the two programs share the machine's cores with the API
        # server, so CPU a write on either side is time taken from the writes.
        cpu_ms = {k: statistics.median(v) * 1e3 for k, v in spent.items()}
        self.figures.update(mark_cpu_operator_ms=cpu_ms["operator"], mark_cpu_bare_ms=cpu_ms["bare"],
                            mark_cpu_api_op_ms=cpu_ms["api_op"],
                            mark_cpu_api_bare_ms=cpu_ms["api_bare"])  # fmt: skip
        self.row("operator CPU a mark / bare client's CPU a patch", cpu_ms["operator"] / cpu_ms["bare"],
                 "report", True,
                 f"medians of {runs}: {cpu_ms['operator']:.2f} / {cpu_ms['bare']:.2f} ms (the operator's "
                 f"from its deadline to its last mark seen, its watch of its own marks included); "
                 f"the API server's CPU in the same windows: {cpu_ms['api_op']:.2f} ms a mark, "
                 f"{cpu_ms['api_bare']:.2f} ms a bare patch")  # fmt: skip
        self.figures.update(mark_gc_op_ms=cpu_ms["gc_op"], mark_gc_bare_ms=cpu_ms["gc_bare"])
        gc_ratios = [o / b for o, b in zip(spent["gc_op"], spent["gc_bare"], strict=True) if b > 0]
        self.row("API server GC CPU a mark / a bare patch", statistics.median(gc_ratios or [0.0]),
                 "report", True,
                 (f"median of the {len(gc_ratios)} runs whose bare window had a cycle"
                  if gc_ratios else "no bare window had a cycle, so no ratio (0 stands for "
                  "none)") + ", from its GODEBUG=gctrace=1 lines: "
                 f"{cpu_ms['gc_op']:.2f} / {cpu_ms['gc_bare']:.2f} ms; runs "
                 + ", ".join(f"{o * 1e3:.2f}/{b * 1e3:.2f}" for o, b in
                             zip(spent["gc_op"], spent["gc_bare"], strict=True)))  # fmt: skip

    def bare_patches(self, names: list[str], message: str = "bare patch") -> BarePatches:
        """Status patches of the same sandboxes by a bare client (a process of its
        own, the operator's concurrency) on the same API server while the operator
        watches: both pay the same watch fan-out. It sends them as the operator's
        user, so the API server audits them as it audits the marks."""
        return bare_patches(str(self.op_kubeconfig), NS, names, MARK_CONCURRENCY, message)

    def bare_marking(self, node: str) -> BarePatches:
        """A bare client making the requests a marking pass of ``node`` makes (its
        listings and the writes), with the operator's concurrency and first page."""
        return bare_marking(str(self.op_kubeconfig), node, MARK_CONCURRENCY, FIRST_PAGE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="M=150,000 / N=5,000")
    parser.add_argument("--sandboxes", type=int, default=15_000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--mark-runs", type=int, default=5)
    parser.add_argument("--mark-sandboxes", type=int, default=1000)
    parser.add_argument(
        "--rest-only",
        action="store_true",
        help="stop after the rest rows (memory, idle CPU, requests at rest)",
    )
    parser.add_argument(
        "--mark-only",
        action="store_true",
        help="only the marking rows (the operator at its defaults on the whole fleet): "
        "at --full they take about 45 of the 70 minutes, the rest rows the other 25",
    )
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--figures", type=Path, help="append this run's figures (JSON lines)")
    parser.add_argument("--plot", type=Path, help="write the SVG plot of --figures here")
    args = parser.parse_args()
    if args.full:
        args.sandboxes, args.nodes = 150_000, 5_000
    # Renewals at 100/s at most: what this machine's API server takes beside the rest.
    every = max(5.0, args.nodes / 100)
    started = time.monotonic()
    scale = Scale(Path(tempfile.mkdtemp(prefix="sl-scale-")), args.nodes, args.sandboxes, every)
    load = LoadSampler()
    stopped = None
    try:
        print(f"scale: {args.sandboxes} sandboxes over {args.nodes} nodes, leases renewed "
              f"every {every:g}s for {scale.duration}s, resync every {scale.resync:g}s",
              flush=True)  # fmt: skip
        if args.mark_only:
            scale.add_nodes()
            scale.populate()
            op = scale.start()  # the guard at its defaults, as in the full run's marking
            scale.watch = DeadWatch(scale.api, NS)
            try:
                scale.marking(args.mark_runs, args.mark_sandboxes, op)
            finally:
                op.stop()
            return 0
        scale.baseline()
        scale.populate()
        op = scale.startup()
        scale.watch = DeadWatch(scale.api, NS)
        try:
            scale.rest(op)
            if args.rest_only:
                return 0
            scale.reaction_one()
            scale.reaction_many("off")
        finally:
            op.stop()
        op = scale.start()  # the guard at its defaults
        try:
            scale.reaction_many("on")
            if args.mark_runs:
                scale.marking(args.mark_runs, args.mark_sandboxes, op)
        finally:
            op.stop()
    except BaseException as e:  # what was measured is kept, with why the rest was not
        stopped = f"{type(e).__name__}: {e}"[:300]
        raise
    finally:
        scale.close()
        load.stop()
        f = scale.figures
        f["run_seconds"] = time.monotonic() - started
        f["load_min"], f["load_max"] = load.low, load.high
        if stopped:
            f["stopped"] = stopped
        print(f"scale run took {f['run_seconds']:.0f}s, load average {load.low:.1f}-"
              f"{load.high:.1f}" + (f", stopped by {stopped}" if stopped else ""),
              flush=True)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(scale.rows, indent=2))
        if args.figures:
            with args.figures.open("a") as out:
                out.write(json.dumps(f) + "\n")
            if args.plot:
                write_plot(args.figures, args.plot)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # Stopped with SIGTERM: unwind, so the control plane stops and the figures are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
