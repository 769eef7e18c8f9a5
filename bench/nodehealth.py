"""Node-health benchmarks against the physical limit, each a ratio measured in one run.

Starts a private control plane and real ``sandlot operator`` processes, then:

1. marking throughput: one node with N Running sandboxes (default 2,000) loses its
   lease; sandboxes marked Dead per second by the operator (from the grace deadline
   to the last mark), over the rate of plain status patches of the same objects sent
   by a bare client with the same concurrency, against the same API server;
2. deadline precision: time from the grace deadline to the last mark, over
   (lease duration + grace), for a node with 1,000 sandboxes, and over the time the
   bare client takes for as many status writes in the same run (the floor: on two
   cores 1,000 writes take longer than 5 % of lease + grace, whoever sends them);
3. API cost: requests the operator sends per resync pass for a handled node, and per
   sandbox for the first handling (client-side counter);
4. operator memory: RSS empty, with K nodes, and with M sandboxes on them; per
   sandbox over the RSS with the nodes alone (each node's cost shown apart), and
   the CPU it burns over one resync interval while nothing changes;
5. failover: time for the standby operator to lead after the active one is SIGKILLed.

    .venv/bin/python bench/nodehealth.py [--sandboxes 2000] [--precision 1000] [--memory 10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from tests.support.operator import AgentLease, OperatorProcess, wipe_nodes

from bench.scalefleet import bare_marking
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api import GROUP, VERSION
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.api.reasons import SandboxReason
from sandlot.api.timestamps import parse_time
from sandlot.controllers.marking import FIRST_PAGE_PER_WRITER
from sandlot.devtools.controlplane import ControlPlane
from sandlot.policy.marking import dead_status

CONCURRENCY = 16
# The operator's first page of a lost node's sandboxes at that concurrency.
FIRST_PAGE = FIRST_PAGE_PER_WRITER * CONCURRENCY
GRACE = 3.0
PRECISION_GRACE = 20.0
LEASE = 2


def moment(text: str) -> datetime:
    """``parse_time`` of a timestamp the API server returned (never absent here)."""
    when = parse_time(text)
    assert when is not None
    return when


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, quiet: float = 0.1, window: float = 2.0, timeout: float = 120.0) -> None:
    """Wait until the process burns under ``quiet`` cores over ``window`` seconds:
    the events it was sent are handled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(window)
        if (cpu_seconds(pid) - before) / window < quiet:
            return
    raise TimeoutError(f"operator still busy after {timeout:.0f}s")


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.plane = ControlPlane(workdir=work / "cp")
        self.plane.start()
        self.api = load_api_client(str(self.plane.kubeconfig), pool_size=64)
        apply_crds(self.api, [crd_for(k) for k in KINDS])
        self.objs: Any = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.ns = "bench"
        self.lease_ns = "sandlot-system"
        for ns in (self.ns, self.lease_ns):
            self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        self.rows: list[dict[str, Any]] = []
        self.operators: list[OperatorProcess] = []
        """Every operator started, stopped (again: stopping is idempotent) on close,
        so a run that fails half-way leaves no operator behind."""

    def close(self) -> None:
        for op in self.operators:
            op.stop()
        self.api.close()
        self.plane.stop()

    def row(self, name: str, value: float, target: str, ok: bool, detail: str) -> None:
        self.rows.append(
            {
                "benchmark": name,
                "value": round(value, 4),
                "target": target,
                "ok": ok,
                "detail": detail,
            }
        )
        print(
            f"  {name}: {value:.4g} (target {target}) {'ok' if ok else 'MISSED'} - {detail}",
            flush=True,
        )

    # -- fixtures ---------------------------------------------------------------

    def node(self, name: str) -> None:
        self.objs.create_cluster_custom_object(
            GROUP,
            VERSION,
            "sandboxnodes",
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxNode", "metadata": {"name": name}},
        )

    def sandboxes(self, node: str, count: int, prefix: str) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]

        def make(name: str) -> None:
            self.objs.create_namespaced_custom_object(
                GROUP,
                VERSION,
                self.ns,
                "sandboxes",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Sandbox",
                    "metadata": {"name": name},
                    "spec": {"image": "example.test/busybox:1", "nodeName": node},
                },
            )
            self.objs.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.ns,
                "sandboxes",
                name,
                {"status": {"phase": "Running", "ip": "10.0.0.1"}},
            )

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(make, names))
        return names

    def operator(self, *flags: str) -> OperatorProcess:
        op = OperatorProcess(self.plane, self.work, self.lease_ns, *flags)
        self.operators.append(op)
        op.wait_metrics(60)
        return op

    def wait(self, probe: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    def node_phase(self, node: str) -> str | None:
        return (
            self.objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node).get("status")
            or {}
        ).get("phase")

    def mark_times(self, node: str) -> list[datetime]:
        items = self.objs.list_cluster_custom_object(
            GROUP, VERSION, "sandboxes", field_selector=f"spec.nodeName={node}"
        )["items"]
        return [
            moment(i["status"]["finishedAt"])
            for i in items
            if (i.get("status") or {}).get("phase") == "Dead"
        ]

    # -- 1 + 2 + 3: a node loses its lease ------------------------------------------

    def lose_node(self, count: int, tag: str, grace: float = GRACE) -> dict[str, Any]:
        wipe_nodes(self.api)
        node = f"{tag}-{uuid.uuid4().hex[:4]}"
        self.node(node)
        self.sandboxes(node, count, node)
        lease = AgentLease(self.api, self.lease_ns, node, duration=LEASE)
        op = self.operator(
            "--grace-period",
            f"{grace}s",
            "--resync-interval",
            "1s",
            "--mark-concurrency",
            str(CONCURRENCY),
        )
        try:
            self.wait(lambda: self.node_phase(node) == "Ready", 30, "node Ready")
            # The operator's start-up done before the lease stops: while it still takes
            # in its start-up listings, its Lease watch thread waited for the GIL, and
            # the last renewal was observed 0.32-0.39 s after it was written (5-7 ms
            # once quiet), which moved the operator's deadline, not its precision.
            settle(op.proc.pid)
            before = self.object_requests(op)
            last = lease.pause()
            deadline = last + timedelta(seconds=LEASE + grace)
            self.wait(
                lambda: len(self.mark_times(node)) == count,
                120 + count / 20,
                f"{count} sandboxes Dead",
            )
            handled = self.wait(
                lambda: (
                    (
                        self.objs.get_cluster_custom_object(
                            GROUP, VERSION, "sandboxnodes", node
                        ).get("status")
                        or {}
                    )
                    .get("health", {})
                    .get("handledAt")
                ),
                30,
                "latch",
            )
            time.sleep(1.5)
            after_first = self.object_requests(op)
            mark_seconds = op.metric("sandlot_operator_mark_duration_seconds_sum")
            time.sleep(5)  # five resync passes of a handled node
            after_idle = self.object_requests(op)
            leases_idle = op.metric("sandlot_operator_api_requests_total", resource="leases")
            # The pass that marked started at handledAt (it stamps every mark with that
            # moment); its last write landed mark_seconds later.
            last_mark = moment(handled) + timedelta(seconds=mark_seconds)
            # The limit, measured against the same API server with the operator still
            # running (and watching), so both rates pay the same watch fan-out.
            bare = self.bare_rate(node, count)
            # The same writes with the requests a marking pass must make first (the
            # node's first page and its whole listing), by a bare client.
            passed = bare_marking(str(self.plane.kubeconfig), node, CONCURRENCY, FIRST_PAGE)
            return {
                "bare": bare,
                "bare_pass_seconds": passed.seconds,
                "node": node,
                "deadline": deadline,
                "last_mark": last_mark,
                "mark_seconds": mark_seconds,
                "handled": handled,
                "first_requests": after_first - before,
                "idle_requests": after_idle - after_first,
                "idle_lease_requests": leases_idle,
            }
        finally:
            lease.stop()
            op.stop()

    @staticmethod
    def object_requests(op: OperatorProcess) -> float:
        """Requests on sandboxes, nodes and events: the cost of node health (leader-election
        renewals of the operator's own Lease are counted apart)."""
        return sum(
            op.metric("sandlot_operator_api_requests_total", resource=r)
            for r in ("sandboxes", "sandboxnodes", "events")
        )

    def bare_rate(self, node: str, count: int) -> float:
        items = self.objs.list_cluster_custom_object(
            GROUP, VERSION, "sandboxes", field_selector=f"spec.nodeName={node}"
        )["items"]

        def patch(item: dict[str, Any]) -> None:
            self.objs.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.ns,
                "sandboxes",
                item["metadata"]["name"],
                {
                    "metadata": {"resourceVersion": item["metadata"]["resourceVersion"]},
                    # The fields a mark writes (phase, reason, message, finishedAt, the
                    # Ready condition), so the API server does for each patch what it
                    # does for a mark.
                    "status": dead_status(
                        SandboxReason.NODE_LOST, "bare client patch", datetime.now(UTC)
                    ),
                },
            )

        start = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(patch, items))
        return count / (time.perf_counter() - start)

    def throughput(self, count: int) -> None:
        print(f"marking throughput: 1 node, {count} Running sandboxes", flush=True)
        r = self.lose_node(count, "tp")
        window = r["mark_seconds"]
        op_rate = count / max(window, 1e-3)
        bare = r["bare"]
        ratio = op_rate / bare
        self.row(
            "marking throughput (operator / bare client)",
            ratio,
            ">= 0.8",
            ratio >= 0.8,
            f"operator {op_rate:.0f}/s (list + marks took {window:.2f}s), "
            f"bare status patches {bare:.0f}/s, concurrency {CONCURRENCY}",
        )
        per_sb = r["first_requests"] / count
        self.row(
            "API requests per sandbox, first handling",
            per_sb,
            "<= 1 + c/N",
            r["first_requests"] <= count + 10,
            f"{r['first_requests']:.0f} sandbox/node/event requests for {count} sandboxes",
        )
        idle = r["idle_requests"]
        self.row(
            "API requests per pass, handled node",
            idle / 5,
            "0",
            idle == 0,
            f"{idle:.0f} sandbox/node/event requests over 5 resync passes (the leader "
            f"Lease renewals, {r['idle_lease_requests']:.0f} in the run, are not per node)",
        )

    def precision(self, count: int, runs: int = 3) -> None:
        print(f"deadline precision: 1 node, {count} sandboxes, {runs} runs", flush=True)
        lates, starts, floors, passes = [], [], [], []
        for _ in range(runs):
            r = self.lose_node(count, "pr", grace=PRECISION_GRACE)
            lates.append((r["last_mark"] - r["deadline"]).total_seconds())
            starts.append((moment(r["handled"]) - r["deadline"]).total_seconds())
            # What the same writes take at the API server's own rate, measured in the
            # same run: no marking pass can end sooner after the deadline than this.
            floors.append(count / r["bare"])
            passes.append(r["bare_pass_seconds"])
        late, floor = statistics.median(lates), statistics.median(floors)
        ratio = late / (LEASE + PRECISION_GRACE)
        self.row(
            "deadline to last mark / (lease + grace)",
            ratio,
            "< 0.05 and < 2s",
            ratio < 0.05 and late < 2.0 and min(starts) >= -0.05,
            f"median of {runs}: marking began {statistics.median(starts):.3f}s and ended "
            f"{late:.3f}s after the deadline; lease {LEASE}s + grace {PRECISION_GRACE}s; the "
            f"floor: {count} status writes at the bare client's "
            f"{count / floor:.0f}/s take {floor:.3f}s "
            f"({floor / (LEASE + PRECISION_GRACE):.4f} of lease + grace)",
        )
        # A marking pass must list the node before it writes; the bare patches above
        # do not. Against a bare client making the same listings and writes:
        against = [la / ps for la, ps in zip(lates, passes, strict=True)]
        self.row(
            f"deadline to last mark / a bare marking pass, median of {runs}",
            statistics.median(against),
            "<= 1.1",
            statistics.median(against) <= 1.1 and min(starts) >= -0.05,
            "runs "
            + ", ".join(
                f"{r:.3f} (began {st:.3f}s, ended {la:.3f}s after the deadline; the bare pass "
                f"{ps:.3f}s, its writes alone {fl:.3f}s)"
                for r, st, la, ps, fl in zip(against, starts, lates, passes, floors, strict=True)
            )
            + f"; {count} sandboxes, concurrency {CONCURRENCY}, the node's first page of "
            f"{FIRST_PAGE} and its whole listing, same API server",
        )

    def memory(self, total: int, nodes: int) -> None:
        print(f"operator memory: {total} sandboxes over {nodes} nodes", flush=True)
        wipe_nodes(self.api)
        resync = 30.0
        # These nodes have no agent. A node whose Lease the operator never saw counts
        # as Ready for one agent lease duration after it first saw it, then turns
        # NotReady (a status write and an Event each): with the default 60 s, every
        # node turned inside the idle window below, and that window measured 0.06
        # cores of one-off transitions, not rest. With a lease of LEASE seconds they
        # turn while they are created, and the grace of an hour holds them NotReady,
        # unchanging, for the rest of the run.
        op = self.operator(
            "--grace-period", "1h",
            "--resync-interval", f"{resync:g}s",
            "--agent-lease-duration", f"{LEASE}s",
        )  # fmt: skip
        pid = op.proc.pid
        try:
            settle(pid)
            rss0 = rss_kb(pid)
            names = [f"mem-{i}" for i in range(nodes)]
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                list(pool.map(self.node, names))
            # The nodes' own cost (kopf timers, node bodies, the first Event's client)
            # is measured apart, so the per-sandbox figure holds only what grows with
            # the sandboxes.
            settle(pid)
            rss_nodes = rss_kb(pid)
            per = total // nodes
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda n: self.sandboxes(n, per, n), names))
            settle(pid)
            rss1 = rss_kb(pid)
            cpu0 = cpu_seconds(pid)
            requests0 = self.object_requests(op)
            time.sleep(resync)  # one whole resync interval: every node's timer fires once
            idle_cpu = (cpu_seconds(pid) - cpu0) / resync
            idle_requests = self.object_requests(op) - requests0
            per_kb = (rss1 - rss_nodes) / (per * nodes)
            self.row(
                "operator RSS per sandbox (KB)",
                per_kb,
                "< 3",
                per_kb < 3,
                f"RSS {rss0 / 1024:.0f} MiB empty, {rss_nodes / 1024:.0f} MiB with {nodes} "
                f"nodes ({(rss_nodes - rss0) / nodes:.0f} KB each), {rss1 / 1024:.0f} MiB "
                f"with {per * nodes} sandboxes on them",
            )
            self.row(
                "operator idle CPU (cores)",
                idle_cpu,
                "< 0.05",
                idle_cpu < 0.05,
                f"{idle_cpu:.4f} cores over {resync:g} s (one resync interval) with "
                f"nothing changing ({nodes} nodes NotReady within an hour's grace); "
                f"{idle_requests:.0f} sandbox/node/event requests in it",
            )
        finally:
            op.stop()

    def failover(self) -> None:
        print("failover: two operators, SIGKILL the leader", flush=True)
        a = self.operator("--resync-interval", "5s")
        b = self.operator("--resync-interval", "5s")
        try:
            leader = self.wait(
                lambda: next((o for o in (a, b) if o.is_leader()), None), 30, "leader"
            )
            standby = b if leader is a else a
            time.sleep(2)
            killed = time.monotonic()
            leader.kill()
            self.wait(standby.is_leader, 40, "standby to lead")
            took = time.monotonic() - killed
            self.row(
                "failover after SIGKILL (s)",
                took,
                "<= 15",
                took <= 15,
                "leader lease 12s, retry 2s",
            )
        finally:
            a.stop()
            b.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=2000)
    parser.add_argument("--precision", type=int, default=1000)
    parser.add_argument("--memory", type=int, default=10000)
    parser.add_argument("--memory-nodes", type=int, default=500)
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    bench = Bench(Path(tempfile.mkdtemp(prefix="sl-bench-nh-")))
    try:
        bench.throughput(args.sandboxes)
        bench.precision(args.precision)
        bench.failover()
        if args.memory:
            bench.memory(args.memory, args.memory_nodes)
    finally:
        bench.close()
    if args.json:
        args.json.write_text(json.dumps(bench.rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
