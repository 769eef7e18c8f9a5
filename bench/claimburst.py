"""Claims at a thousand a second: a burst of claims on a large warm pool, against the
same writes sent by a bare client, and claim-to-Bound at a sustained rate.

A local control plane and the real operator (a process). The bench plays the
agents of ``--nodes`` SandboxNodes itself (their Leases renewed, each member the
operator schedules set Running with an address), so a warm pool of ``--pool``
members costs no containers. Rows, each with its target:

- claims/s through the operator: ``--claims`` claims created from
  ``--senders`` threads at once, first create to last Bound seen on a watch;
- the same number of claims' writes sent by a bare client (``claims.bare_bind``:
  create the claim, take a member at its resourceVersion, write the claim's
  status) from as many threads, with the operator stopped; target ratio >= 0.9;
- claims sent at ``--rate-share`` (80%) of that bare rate for ``--seconds`` (60),
  through the operator and by the bare client, each on a pool warm enough for all
  of them: claim-to-Bound p99 through the operator <= 2x the bare writes' p99.

The two bursts run back to back on the same store, the operator's first; the
paced rows' rate and count come from the bare burst. Between rows the operator is
started again and the pool refilled (and grown to hold the paced minute), so each
row starts on a warm pool.

- on paper: the claims/s one operator replica sustains where the API server takes
  1,000 writes/s, from the writes a claim costs (every party's, the burst until the
  pool is refilled: ``bench/apicost.py``) and the operator's CPU a claim, naming the
  first limit;
- the SDK's ``claim()`` to first ``run()`` p50, ``--sdk-rounds`` rounds on a warm
  pool of ``--sdk-pool`` on one real node (a real agent, the stream gateway and a
  private containerd: ``bench/claimsdk.py``), after the rows above, with the
  operator started again; target <= the exec floor (a bare ``run`` on a claimed
  sandbox, p50 in the same run) + 100 ms. ``--sdk-rounds 0`` leaves it out.

    sudo .venv/bin/python bench/claims.py --burst [--claims 1000 --pool 1000]
    sudo .venv/bin/python bench/claims.py --burst --claims 200 --pool 200 --seconds 10  # quick
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import watch
from tests.support.operator import Fleet

from bench.apicost import ClaimCosts, api_writes
from bench.claims import POOL, WATCH_SECONDS, FirstSeen, bare_bind, create, load_average, pct
from bench.claimsdk import measure_sdk, sdk_row
from bench.nodehealth import Bench, cpu_seconds
from sandlot.adapters.objects import Objects
from sandlot.api import GROUP, VERSION
from sandlot.api.common import CLAIMS
from sandlot.api.keys import POOL_LABEL

RATIO_TARGET = 0.9
API_WRITES_PER_SECOND = 1000  # the API server's rate the on-paper row assumes
P99_RATIO_TARGET = 2.0  # paced claims' p99 through the operator / the bare writes' p99
SPEC = {"image": "example.test/busybox:1", "terminationGracePeriodSeconds": 0}


class PlayedAgents:
    """Sets every sandbox the operator scheduled Running with an address, as the
    node's agent would once its container started."""

    def __init__(self, bench: Bench, threads: int = 8) -> None:
        self.bench = bench
        self._started: set[str] = set()
        self.count = 0  # members set Running (the bench's own writes)
        self._addresses = itertools.count(1)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="played-agent")
        self._watch = watch.Watch()
        self._stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="played-agents").start()

    def _run(self) -> None:
        while not self._stopped.is_set():  # a watch that ends lists and watches again
            try:
                self._stream()
            except Exception as e:
                if not self._stopped.is_set():
                    print(f"played agents' watch ended: {type(e).__name__}; again", flush=True)
                    time.sleep(1.0)

    def _stream(self) -> None:
        for event in self._watch.stream(
            self.bench.objs.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.bench.ns,
            "sandboxes",
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(5.0, WATCH_SECONDS + 10.0),
        ):
            sb = event["object"]
            name = sb["metadata"]["name"]
            if event["type"] == "DELETED" or name in self._started:
                continue
            if (sb.get("status") or {}).get("phase") == "Scheduled":
                self._started.add(name)
                self.count += 1
                self._pool.submit(self._start, name, next(self._addresses))

    def _start(self, name: str, n: int) -> None:
        self.bench.objs.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.bench.ns,
            "sandboxes",
            name,
            {
                "status": {
                    "phase": "Running",
                    "ip": f"10.{n // 62500}.{n // 250 % 250}.{n % 250 + 1}",
                }
            },
        )

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)


def warm_members(bench: Bench) -> dict[str, str]:
    """The pool's Running members: name -> resourceVersion."""
    members = bench.objs.list_namespaced_custom_object(
        GROUP, VERSION, bench.ns, "sandboxes", label_selector=f"{POOL_LABEL}={POOL}"
    )["items"]
    return {
        m["metadata"]["name"]: m["metadata"]["resourceVersion"]
        for m in members
        if (m.get("status") or {}).get("phase") == "Running"
    }


def wait_warm(bench: Bench, size: int, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while len(members := warm_members(bench)) < size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool {POOL}: {len(members)} of {size} members Running")
        time.sleep(1.0)
    return members


def burst(count: int, senders: int, one: Callable[[int], float]) -> float:
    """``one(i)`` for each claim from ``senders`` threads; returns claims per second,
    the first send to the last Bound (``one`` returns when its claim was Bound)."""
    began = time.monotonic()
    with ThreadPoolExecutor(senders) as pool:
        ends = list(pool.map(one, range(count)))
    return count / (max(ends) - began)


def paced(count: int, rate: float, one: Callable[[int], float]) -> tuple[list[float], float]:
    """``one(i)`` started at ``i / rate`` s; its latencies (ms) and the rate sent."""
    began = time.monotonic()
    futures = []
    with ThreadPoolExecutor(64) as pool:
        for i in range(count):
            delay = began + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, i))
        sent = count / max(1e-9, time.monotonic() - began)
        return [f.result() for f in futures], sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--pool", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument(
        "--rate-share",
        type=float,
        default=0.8,
        help="the paced rows' rate, as a share of the bare burst's",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="the paced rows' length")
    parser.add_argument("--sdk-rounds", type=int, default=20)
    parser.add_argument("--sdk-pool", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the rows here too (bench/run.py)")
    args = parser.parse_args(argv)
    if args.claims > args.pool:
        parser.error(f"--claims {args.claims} is more than --pool {args.pool}: the floor "
                     "needs a member for each claim")  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="sl-claimburst-"))
    bench = Bench(work)
    sdk: tuple[list[float], list[float], list[float]] | None = None
    fleet = Fleet(bench.api, bench.ns, bench.lease_ns)
    agents: PlayedAgents | None = None
    try:
        agents = PlayedAgents(bench)
        bound = FirstSeen(bench, CLAIMS, lambda o: (o.get("status") or {}).get("phase") == "Bound")
        objects = Objects(bench.api)
        op = bench.operator("--resync-interval", "30s")
        bench.wait(op.is_leader, 60, "the operator to lead")
        create(bench, "sandboxpools", "SandboxPool", POOL, {"replicas": args.pool,
               "template": {"spec": SPEC}})  # fmt: skip
        nodes = Nodes(bench, fleet, args.nodes)
        nodes.room(args.pool * 3)
        wait_warm(bench, args.pool, warm_timeout(args.pool))
        load_before = load_average()
        print(f"pool of {args.pool} warm; load average {load_before:.1f}", flush=True)

        # The two bursts back to back, on the same store: through the operator, then
        # the bare client's (the floor, and the paced rows' rate) on the pool refilled.
        def burst_one(i: int) -> float:
            create(bench, CLAIMS, "SandboxClaim", f"burst-{i}", {"poolName": POOL})
            return bound.wait(f"burst-{i}", 300)

        writes0, cpu0, started0 = api_writes(bench.api), cpu_seconds(op.proc.pid), agents.count
        operator_rate = burst(args.claims, args.senders, burst_one)
        members = wait_warm(bench, args.pool, warm_timeout(args.pool))
        costs = ClaimCosts(
            args.claims,
            api_writes(bench.api) - writes0,
            args.claims + agents.count - started0,
            cpu_seconds(op.proc.pid) - cpu0,
        )
        op.stop()
        targets = sorted(members.items())

        def bare_one(i: int) -> float:
            target, version = targets[i]
            bare_bind(bench, objects, bound, target, f"bare-{i}", version)
            return bound.seen[f"bare-{i}"]

        bare_rate = burst(args.claims, args.senders, bare_one)
        load_after = load_average()
        rate = args.rate_share * bare_rate
        count = max(1, int(rate * args.seconds))
        print(f"bare burst {bare_rate:.1f} claims/s: pacing {count} claims at {rate:.1f}/s",
              flush=True)  # fmt: skip

        # The bare client paced: the pool grown to hold the whole minute first.
        size = max(args.pool, count)
        op = refill(bench, nodes, size, 2 * args.claims + 2 * size)
        op.stop()
        targets = sorted(warm_members(bench).items())

        def bare_paced(i: int) -> float:
            target, version = targets[i]
            return bare_bind(bench, objects, bound, target, f"bare-paced-{i}", version)

        bare_latencies, bare_sent = paced(count, rate, bare_paced)

        def claim(prefix: str, wait: float) -> Callable[[int], float]:
            def one(i: int) -> float:
                began = time.monotonic()
                create(bench, CLAIMS, "SandboxClaim", f"{prefix}-{i}", {"poolName": POOL})
                return (bound.wait(f"{prefix}-{i}", wait) - began) * 1000

            return one

        # Through the operator, paced on a pool refilled for the minute.
        op = refill(bench, nodes, size, 2 * args.claims + 3 * size)
        latencies, sent = paced(count, rate, claim("paced", 120))
        if args.sdk_rounds > 0:
            # The real node's agent alone sets sandboxes Running from here; the
            # burst's pool goes, so the operator started again does not refill it.
            op.stop()
            agents.stop()
            agents = None
            bench.objs.delete_namespaced_custom_object(GROUP, VERSION, bench.ns,
                                                       "sandboxpools", POOL)  # fmt: skip
            op = bench.operator("--resync-interval", "30s")
            bench.wait(op.is_leader, 120, "the operator to lead again")
            sdk = measure_sdk(bench, work, args.sdk_rounds, args.sdk_pool)
        op.stop()
    finally:
        if agents is not None:
            agents.stop()
        bench.close()
    ratio = operator_rate / bare_rate
    print(f"claims, {args.claims} on a warm pool of {args.pool} over {args.nodes} played "
          f"nodes, {args.senders} senders (load average {load_before:.1f} -> "
          f"{load_after:.1f}):")  # fmt: skip
    bench.row("operator claims/s", operator_rate, "-", True, "first create to last Bound")
    bench.row("bare client claims/s", bare_rate, "-", True, "the same writes, operator stopped")
    bench.row("operator / bare client", ratio, f">= {RATIO_TARGET}", ratio >= RATIO_TARGET,
              f"{operator_rate:.1f} / {bare_rate:.1f} claims/s")  # fmt: skip
    p50, p99 = pct(latencies, 0.5), pct(latencies, 0.99)
    bare_p50, bare_p99 = pct(bare_latencies, 0.5), pct(bare_latencies, 0.99)
    paced_ratio = p99 / bare_p99
    bench.row(f"claim-to-Bound p99 at {args.rate_share:.0%} of the bare rate / bare writes' p99",
              paced_ratio, f"<= {P99_RATIO_TARGET:g}",
              paced_ratio <= P99_RATIO_TARGET and sent >= 0.9 * rate,
              f"{count} claims over {args.seconds:g} s at {rate:.1f}/s (sent {sent:.1f}/s, "
              f"bare {bare_sent:.1f}/s): operator p50 {p50:.1f} / p99 {p99:.1f} ms, "
              f"bare p50 {bare_p50:.1f} / p99 {bare_p99:.1f} ms")  # fmt: skip
    sustained, limit = costs.on_paper(API_WRITES_PER_SECOND)
    bench.row(f"claims/s on paper, one replica, API server at {API_WRITES_PER_SECOND:,} "
              "writes/s", sustained, "-", True,
              f"first limit: {limit}; writes a claim, burst to pool refilled: "
              f"{costs.writes_per_claim:.2f} ({costs.operator_writes_per_claim:.2f} the "
              f"operator's: {costs.breakdown()}); operator CPU "
              f"{costs.cpu_per_claim * 1000:.2f} ms a claim")  # fmt: skip
    if sdk is not None:
        sdk_row(bench, *sdk, args.sdk_pool)
    else:
        print("  SDK claim() to first run() p50: not measured (--sdk-rounds 0) - MISSED",
              flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(bench.rows))
    return 0


class Nodes:
    """The played nodes: their Leases, and room on them for every member to come."""

    def __init__(self, bench: Bench, fleet: Fleet, count: int) -> None:
        self.bench, self.names = bench, [fleet.node(f"n{i:02d}") for i in range(count)]
        for node in self.names:
            fleet.lease(node, duration=10)
        self.capacity = 0

    def room(self, sandboxes: int) -> None:
        """Room for ``sandboxes`` in all: claimed members stay Running on their nodes."""
        per_node = sandboxes // len(self.names) + 10
        if per_node <= self.capacity:
            return
        for node in self.names:
            self.bench.objs.patch_cluster_custom_object_status(
                GROUP, VERSION, "sandboxnodes", node,
                {"status": {"capacity": {"sandboxes": per_node}}},
            )  # fmt: skip
        self.capacity = per_node


def warm_timeout(size: int) -> float:
    return 120 + size * 0.5


def refill(bench: Bench, nodes: Nodes, size: int, sandboxes: int) -> Any:
    """The operator started again, the pool at ``size`` and warm: the operator."""
    nodes.room(sandboxes)
    op = bench.operator("--resync-interval", "30s", "--pool-max-replicas", str(size))
    bench.wait(op.is_leader, 60, "the operator to lead")
    bench.objs.patch_namespaced_custom_object(GROUP, VERSION, bench.ns, "sandboxpools", POOL,
                                              {"spec": {"replicas": size}})  # fmt: skip
    wait_warm(bench, size, warm_timeout(size))
    return op
