"""Recovery of one operator replica at fleet scale, each figure measured in one run:

1. a kill -9 and a standby-free restart: N nodes whose Leases one process renews
   throughout, M Running sandboxes loaded straight into etcd, and a few pools with
   Services and Bound claims (as ``tests/integration/test_operator_restart.py``
   builds them, on spare nodes of their own). The leader is killed, a Pending
   sandbox is created, and once the dead leader's Lease has expired a new operator
   starts (through a relay that slows what it reads, with ``--congested``). From
   that process's start: seconds to ``/readyz`` 200, to the Pending sandbox bound
   (its first correct action) and to its first pool pass; the fewest ready
   endpoints each Service had meanwhile (sampled every ``SAMPLE_EVERY``); the API
   requests it sent until ready (``sandlot_operator_api_requests_total``) and its
   peak RSS (VmHWM);
2. an API-server outage and a congested comeback, the scenario of
   ``tests/integration/test_lease_relist.py`` on a control plane of its own: 1,200
   nodes renew throughout while the operator's path is cut for lease + grace +
   30 s, then restored at 20 kB/s a connection. Live sandboxes marked Dead (target
   0), nodes seen NotReady, and the seconds from the restore until ready again.

    .venv/bin/python bench/recovery.py                # M=15,000 / N=500 (as bench/scale.py)
    .venv/bin/python bench/recovery.py --full         # M=150,000 / N=5,000
    .venv/bin/python bench/recovery.py --sandboxes 2000 --nodes 50 --congested 250000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from tests.support.kube import start_private_plane
from tests.support.netfault import SeveringRelay, relayed_kubeconfig
from tests.support.operator import OperatorProcess

from bench.scalefleet import Agents, create_nodes, load_sandboxes
from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Leases
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import POOL_LABEL
from sandlot.devtools.controlplane import ControlPlane

FLEET_NS, POOL_NS, LEASE_NS = "fleet", "pools", "sandlot-system"
GRACE = 5.0
POOLS, REPLICAS = 3, 4
SPARES, SPARE_CAPACITY = 4, 50  # the only nodes with room: the fleet's nodes are full
PENDING = "a-0-pending"
SAMPLE_EVERY = 0.1
REQUESTS = "sandlot_operator_api_requests_total"
POOL_PASSES = "sandlot_operator_pool_reconcile_duration_seconds_count"
MEMBERS_CREATED = "sandlot_operator_pool_members_created_total"
NODE_PASSES = "sandlot_operator_node_reconcile_duration_seconds_count"
# The outage, as tests/integration/test_lease_relist.py has it.
OUTAGE_NODES = 1200  # three pages of the operator's 500-item Lease list
OUTAGE_LEASE = 20
OUTAGE_RENEW_EVERY = 8.0
OUTAGE = OUTAGE_LEASE + GRACE + 30  # seconds: the fault itself, not a wait
CONGESTED = 20_000  # bytes a second a connection once the path is back
ADDRESSES = itertools.count()


def wait_until(probe: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """``probe()`` once it is truthy; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s (last: {value!r})")
        time.sleep(every)


def readyz(op: OperatorProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/readyz", timeout=2) as r:
            return int(r.status), r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode().strip()
    except OSError as e:
        return 0, type(e).__name__


def metric(op: OperatorProcess, name: str) -> float:
    try:
        return op.metric(name)
    except OSError:
        return 0.0


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def requests_by_kind(op: OperatorProcess) -> dict[str, float]:
    """The operator's API requests so far, by "verb resource"."""
    found: dict[str, float] = {}
    for line in op.metrics().splitlines():
        if line.startswith(REQUESTS + "{"):
            labels, value = line.rsplit(" ", 1)
            verb = labels.split('verb="', 1)[1].split('"', 1)[0]
            resource = labels.split('resource="', 1)[1].split('"', 1)[0]
            found[f"{verb} {resource}"] = float(value)
    return found


class Readiness:
    """``/readyz`` of one operator on a thread, every ``SAMPLE_EVERY``: each change
    of its answer, timed from ``origin`` (monotonic)."""

    def __init__(self, op: OperatorProcess, origin: float) -> None:
        self.op, self.origin = op, origin
        self.changes: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readyz", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            code, body = readyz(self.op)
            if not self.changes or self.changes[-1][1:] != (code, body):
                self.changes.append((time.monotonic() - self.origin, code, body))

    def first(self, code: int, after: float = 0.0) -> float | None:
        return next((t for t, c, _ in self.changes if c == code and t >= after), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def story(self, after: float = 0.0) -> str:
        return "; ".join(f"{t:.1f}s {c} {b[:70]}" for t, c, b in self.changes if t >= after)


class Sampler:
    """Every ``SAMPLE_EVERY``: each Service's ready endpoints (over its EndpointSlices),
    by the Sandbox each names, and the claims not Bound. ``gone``: per Service, the
    endpoints of ``before`` some sample lacked, so a fall names who left."""

    def __init__(self, api: client.ApiClient, before: dict[str, set[str]]) -> None:
        self.discovery = client.DiscoveryV1Api(api)
        self.objs: Any = client.CustomObjectsApi(api)
        self.before = before
        self.min_ready: dict[str, int] = {}
        self.gone: dict[str, set[str]] = {}
        self.left_bound: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                routed = routed_members(self.discovery)
                for service, ready in routed.items():
                    self.min_ready[service] = min(
                        len(ready), self.min_ready.get(service, len(ready))
                    )
                for service, names in self.before.items():
                    missing = names - routed.get(service, set())
                    if missing:
                        self.gone.setdefault(service, set()).update(missing)
                for name, status in claims(self.objs).items():
                    if status.get("phase") != "Bound":
                        self.left_bound.append(name)
            except Exception:  # a slow answer on a loaded API server: the next sample
                continue
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def routed_members(discovery: Any) -> dict[str, set[str]]:
    """Each Service's ready endpoints, by the name of the Sandbox each one targets."""
    found: dict[str, set[str]] = {}
    for es in discovery.list_namespaced_endpoint_slice(POOL_NS).items:
        service = str((es.metadata.labels or {}).get("kubernetes.io/service-name"))
        ready = {
            str(e.target_ref.name if e.target_ref else e.addresses[0])
            for e in es.endpoints or ()
            if e.conditions and e.conditions.ready
        }
        found.setdefault(service, set()).update(ready)
    return found


def claims(objs: Any) -> dict[str, dict[str, Any]]:
    items = objs.list_namespaced_custom_object(GROUP, VERSION, POOL_NS, "sandboxclaims")["items"]
    return {c["metadata"]["name"]: c.get("status") or {} for c in items}


def phases(objs: Any, plural: str, namespace: str | None = None) -> dict[str, int]:
    """Objects of ``plural`` by status.phase, listed in pages."""
    counts: dict[str, int] = {}
    token = None
    while True:
        extra: dict[str, str] = {"_continue": token} if token else {}
        if namespace is None:
            page = objs.list_cluster_custom_object(GROUP, VERSION, plural, limit=5000, **extra)
        else:
            page = objs.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, limit=5000, **extra
            )
        for item in page["items"]:
            phase = (item.get("status") or {}).get("phase", "")
            counts[phase] = counts.get(phase, 0) + 1
        token = page["metadata"].get("continue")
        if not token:
            return counts


class Recovery:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.rows: list[dict[str, Any]] = []
        self.plane: ControlPlane | None = None
        self.agents: Agents | None = None
        self.ops: list[OperatorProcess] = []
        self.relay: SeveringRelay | None = None

    def row(self, name: str, value: float, target: str, ok: bool, detail: str) -> None:
        self.rows.append(
            {"benchmark": name, "value": round(value, 4), "target": target, "ok": ok,
             "detail": detail}
        )  # fmt: skip
        verdict = "ok" if ok else "MISSED"
        print(f"  {name}: {value:.4g} (target {target}) {verdict} - {detail}", flush=True)

    def up(self, name: str, namespaces: tuple[str, ...]) -> ControlPlane:
        self.plane = start_private_plane(self.work / name, namespaces=namespaces)
        return self.plane

    def down(self) -> None:
        for op in self.ops:
            op.stop()
        self.ops = []
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.agents is not None:
            self.agents.stop()
            self.agents = None
        if self.plane is not None:
            self.plane.stop()
            self.plane = None

    def operator(self, plane: ControlPlane, *flags: str, kubeconfig: Path | None = None
                 ) -> OperatorProcess:  # fmt: skip
        op = OperatorProcess(plane, self.work, LEASE_NS, *flags, kubeconfig=kubeconfig)
        self.ops.append(op)
        return op

    # -- 1. kill -9 and a cold restart ---------------------------------------------------

    def restart(self, nodes: int, sandboxes: int, congested: float) -> None:
        every = max(5.0, nodes / 100)  # renewals at 100/s at most, as bench/scale.py
        duration = max(round(3 * every), 2)
        print(f"restart: {sandboxes} sandboxes over {nodes} nodes, leases renewed every "
              f"{every:g}s for {duration}s", flush=True)  # fmt: skip
        plane = self.up("cp-restart", (FLEET_NS, POOL_NS, LEASE_NS))
        kubeconfig = str(plane.kubeconfig)
        api = load_api_client(kubeconfig, pool_size=16, request_timeout=(30.0, 120.0))
        objs: Any = client.CustomObjectsApi(api)
        fleet = [f"n{i:05d}" for i in range(nodes)]
        spares = [f"spare-{i}" for i in range(SPARES)]
        began = time.monotonic()
        create_nodes(kubeconfig, fleet + spares)
        for spare in spares:
            objs.patch_cluster_custom_object_status(
                GROUP, VERSION, "sandboxnodes", spare,
                {"status": {"capacity": {"sandboxes": SPARE_CAPACITY}}},
            )  # fmt: skip
        self.agents = Agents(kubeconfig, LEASE_NS, fleet + spares, self.work, every, duration)
        per = max(sandboxes // nodes, 1)
        placed = [(f"s-{n}-{i}", n) for n in fleet for i in range(per)]
        loaded = load_sandboxes(plane, FLEET_NS, placed)
        print(f"  {len(fleet) + SPARES} nodes renewing, {len(placed)} Running sandboxes "
              f"loaded in {time.monotonic() - began:.0f}s", flush=True)  # fmt: skip
        resync = max(30.0, nodes / 10)
        flags = ("--grace-period", f"{GRACE:g}s", "--agent-lease-duration", f"{duration}s",
                 "--lease-view-max-age", f"{min(45.0, (duration + GRACE) / 2):g}s",
                 "--resync-interval", f"{resync:g}s")  # fmt: skip
        limit = 600 + sandboxes / 100  # seconds any one step may take: 30 min at 150,000

        first = self.operator(plane, *flags)
        started = time.monotonic()
        first.wait_metrics(120)
        wait_until(lambda: readyz(first)[0] == 200, limit, "the first operator ready", 0.5)
        print(f"  first operator ready after {time.monotonic() - started:.0f}s "
              f"(the load took {loaded:.0f}s)", flush=True)  # fmt: skip
        for i in range(POOLS):
            create_pool(objs, f"p{i}")
        wait_until(lambda: steady(objs, api), 300, "every pool's members Running and routed", 1)
        for i in range(POOLS):
            create_claim(objs, f"c{i}", f"p{i}")
        wait_until(lambda: steady(objs, api), 300,
                   "every claim Bound, every Service routing exactly its pool's members", 1)  # fmt: skip
        routed = routed_members(client.DiscoveryV1Api(api))
        before = {service: len(names) for service, names in routed.items()}
        bound = {n: s.get("sandboxName") for n, s in claims(objs).items()}
        print(f"  pools routed {before}, claims Bound {sorted(bound)}", flush=True)

        sampler = Sampler(api, routed)
        time.sleep(1)  # a few samples before the kill
        killed = time.monotonic()
        first.kill()
        objs.create_namespaced_custom_object(GROUP, VERSION, POOL_NS, "sandboxes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Sandbox",
            "metadata": {"name": PENDING}, "spec": {"image": "example.test/busybox:1"},
        })  # fmt: skip
        leases = Leases(api, LEASE_NS)

        def expired() -> bool:
            lease = leases.get("sandlot-operator")
            if lease is None or lease.renew_time is None:
                return False
            return lease.renew_time + timedelta(seconds=lease.duration_seconds) < datetime.now(UTC)

        wait_until(expired, 60, "the killed leader's Lease to expire")
        path = None
        if congested:
            self.relay = SeveringRelay(plane.apiserver_port, downstream_rate=congested).start()
            path = relayed_kubeconfig(plane, self.relay, self.work / "relayed-kubeconfig")
        second = self.operator(plane, *flags, kubeconfig=path)
        origin = time.monotonic()
        ready = Readiness(second, origin)
        seen: dict[str, float] = {}
        requests_at_ready = 0.0
        by_kind: dict[str, float] = {}
        peak_at_ready = 0
        deadline = origin + limit
        while len(seen) < 4:
            if second.proc.poll() is not None:
                raise RuntimeError(f"the new operator exited {second.proc.returncode}:\n"
                                   f"{second.log()}")  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"the new operator after {limit:.0f}s: reached only "
                                   f"{sorted(seen)}; /readyz {ready.story()}")  # fmt: skip
            now = time.monotonic() - origin
            if "leader" not in seen and second.is_leader():
                seen["leader"] = now
            if "ready" not in seen and readyz(second)[0] == 200:
                seen["ready"] = now
                requests_at_ready = metric(second, REQUESTS)
                by_kind = requests_by_kind(second)
                peak_at_ready = peak_kb(second.proc.pid)
            if "bound" not in seen and objs.get_namespaced_custom_object(
                GROUP, VERSION, POOL_NS, "sandboxes", PENDING
            )["spec"].get("nodeName"):
                seen["bound"] = now
            if "pool pass" not in seen and metric(second, POOL_PASSES) > 0:
                seen["pool pass"] = now
            time.sleep(SAMPLE_EVERY)
        time.sleep(2)  # a few more samples after its first passes
        sampler.stop()
        ready.stop()
        peak = peak_kb(second.proc.pid)
        created = metric(second, MEMBERS_CREATED)
        after = {n: s.get("sandboxName") for n, s in claims(objs).items()}
        dead = phases(objs, "sandboxes", FLEET_NS).get("Dead", 0)
        api.close()
        self.down()

        gap = origin - killed
        story = ready.story()
        print(f"  kill -> new process {gap:.1f}s (the leader Lease's expiry); /readyz from its "
              f"start: {story}", flush=True)  # fmt: skip
        size = f"{len(placed)} sandboxes, {nodes} nodes"
        self.row(f"restart ({size}): start -> /readyz 200 (s)", seen["ready"], "report", True,
                 f"leader after {seen['leader']:.1f}s; "
                 + ("direct path" if not congested else f"through {congested:g} B/s a connection")
                 + f"; /readyz: {story}")  # fmt: skip
        self.row(f"restart ({size}): start -> first correct action (s)", seen["bound"],
                 "report", True, f"the Pending sandbox bound to a spare node, "
                 f"{seen['bound'] - seen['leader']:.1f}s after it led and {gap + seen['bound']:.1f}s "
                 f"after the kill; first pool pass "
                 f"at {seen['pool pass']:.1f}s; members created {created:.0f} (0 wanted)")  # fmt: skip
        lowest = min((sampler.min_ready.get(s, 0) - n for s, n in before.items()), default=0)
        self.row("restart: ready endpoints, fewest seen - before the kill", lowest, ">= 0",
                 lowest >= 0 and not sampler.gone and sampler.samples > 10,
                 f"lowest seen {dict(sorted(sampler.min_ready.items()))}, before "
                 f"{dict(sorted(before.items()))}, left "
                 f"{ {k: sorted(v) for k, v in sorted(sampler.gone.items())} }, "
                 f"{sampler.samples} samples every "
                 f"{SAMPLE_EVERY:g}s; claims seen not Bound {len(sampler.left_bound)}, "
                 f"bindings kept {after == bound}")  # fmt: skip
        top = ", ".join(
            f"{v:.0f} {k}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])[:6]
        )
        self.row("restart: API requests until ready", requests_at_ready, "report", True,
                 f"sandlot_operator_api_requests_total at the first /readyz 200: {top}")  # fmt: skip
        self.row(f"restart ({size}): peak RSS (MB)", peak * 1.024 / 1000, "report", True,
                 f"VmHWM {peak_at_ready * 1.024 / 1000:.1f} MB at ready, "
                 f"{peak * 1.024 / 1000:.1f} MB after its first actions")  # fmt: skip
        self.row("restart: fleet sandboxes marked Dead", dead, "0", dead == 0,
                 "every node renewed throughout")  # fmt: skip

    # -- 2. an API-server outage and a congested comeback --------------------------------

    def outage(self) -> None:
        print(f"outage: {OUTAGE_NODES} nodes renewing every {OUTAGE_RENEW_EVERY:g}s, the "
              f"operator's path cut for {OUTAGE}s, back at {CONGESTED} B/s", flush=True)  # fmt: skip
        plane = self.up("cp-outage", (FLEET_NS, LEASE_NS))
        kubeconfig = str(plane.kubeconfig)
        api = load_api_client(kubeconfig, pool_size=8, request_timeout=(30.0, 120.0))
        objs: Any = client.CustomObjectsApi(api)
        names = [f"n{i:04d}" for i in range(OUTAGE_NODES)]
        create_nodes(kubeconfig, names)
        self.agents = Agents(kubeconfig, LEASE_NS, names, self.work, OUTAGE_RENEW_EVERY,
                             OUTAGE_LEASE)  # fmt: skip
        load_sandboxes(plane, FLEET_NS, [(f"sb-{n}", n) for n in names])
        self.relay = relay = SeveringRelay(plane.apiserver_port).start()
        path = relayed_kubeconfig(plane, relay, self.work / "outage-kubeconfig")
        op = self.operator(plane, "--grace-period", f"{GRACE:g}s", kubeconfig=path)
        op.wait_metrics(120)
        wait_until(lambda: phases(objs, "sandboxnodes").get("Ready") == OUTAGE_NODES, 300,
                   f"all {OUTAGE_NODES} nodes Ready", 1)  # fmt: skip
        wait_until(lambda: readyz(op)[0] == 200, 120, "the operator ready", 0.5)

        cut = time.monotonic()
        ready = Readiness(op, cut)
        relay.cut()
        noticed = wait_until(lambda: readyz(op)[0] != 200 and time.monotonic() - cut, 120,
                             "the operator to notice the cut (not ready)", 0.5)  # fmt: skip
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - cut)))
        passes = metric(op, NODE_PASSES)
        relay.restore(downstream_rate=CONGESTED)
        restored = time.monotonic() - cut
        not_ready: dict[str, int] = {}
        worst = 0

        def nodes_ready() -> None:
            nonlocal worst
            now = phases(objs, "sandboxnodes")
            worst = max(worst, OUTAGE_NODES - now.get("Ready", 0))
            for phase, n in now.items():
                if phase != "Ready":
                    not_ready[phase] = max(not_ready.get(phase, 0), n)

        def back() -> bool:
            nodes_ready()
            return readyz(op)[0] == 200

        wait_until(back, 600, "the operator ready again (its lists in through the congested "
                   "path)", 1)  # fmt: skip
        again = time.monotonic() - cut - restored
        judged = metric(op, NODE_PASSES) + OUTAGE_NODES

        def judged_again() -> bool:
            nodes_ready()
            return metric(op, NODE_PASSES) >= judged

        wait_until(judged_again, 300,
                   f"{OUTAGE_NODES} node passes after the view came back", 1)  # fmt: skip
        window_end = time.monotonic() + OUTAGE_LEASE + GRACE
        while time.monotonic() < window_end:  # a window to act in: what it would mark, it marks
            nodes_ready()
            time.sleep(2)
        ready.stop()
        counts = phases(objs, "sandboxes", FLEET_NS)
        dead = counts.get("Dead", 0)
        passed = metric(op, NODE_PASSES) - passes
        api.close()
        self.down()

        story = ready.story()
        print(f"  /readyz from the cut: {story}", flush=True)
        self.row(f"outage of {OUTAGE}s, {OUTAGE_NODES} nodes: Dead marks of live nodes", dead,
                 "0", dead == 0 and counts.get("Running") == OUTAGE_NODES,
                 f"sandboxes by phase {counts} after lease + grace past every node judged "
                 f"again ({passed:.0f} node passes since the restore); nodes not Ready at "
                 f"worst {worst} {not_ready or ''}")  # fmt: skip
        self.row("outage: restore -> /readyz 200 again (s)", again, "report", True,
                 f"cut noticed (not ready) after {noticed:.1f}s; restored at {restored:.0f}s "
                 f"at {CONGESTED} B/s a connection; /readyz from the cut: {story}")  # fmt: skip


def create_pool(objs: Any, name: str) -> None:
    objs.create_namespaced_custom_object(GROUP, VERSION, POOL_NS, "sandboxpools", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxPool", "metadata": {"name": name},
        "spec": {"replicas": REPLICAS, "serviceName": f"svc-{name}", "template": {"spec": {
            "image": "example.test/app:1", "ports": [{"name": "http", "containerPort": 8080}],
        }}},
    })  # fmt: skip


def create_claim(objs: Any, name: str, pool: str) -> None:
    objs.create_namespaced_custom_object(GROUP, VERSION, POOL_NS, "sandboxclaims", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxClaim", "metadata": {"name": name},
        "spec": {"poolName": pool},
    })  # fmt: skip


def settled(
    members: list[dict[str, Any]],
    routed: dict[str, set[str]],
    bound: dict[str, dict[str, Any]],
) -> bool:
    """Whether the pools are in the state the restart is measured from: every claim
    Bound, each Service routing exactly its pool's Running members, ``REPLICAS`` of
    them, and no claimed sandbox among them.

    Bound claims and full Services are not enough: a claim's status is written before
    its pool's next pass takes the claimed member out of the Service; read in between,
    the Service still counts it, and its fall right after is the claim's, not the kill's.
    ``members``: the pool-labelled Sandboxes, read after ``bound`` and before ``routed``."""
    if any(s.get("phase") != "Bound" for s in bound.values()):
        return False
    running: dict[str, set[str]] = {f"svc-p{i}": set() for i in range(POOLS)}
    for m in members:
        if (m.get("status") or {}).get("phase") == "Running":
            pool = m["metadata"]["labels"][POOL_LABEL]
            running.setdefault(f"svc-{pool}", set()).add(m["metadata"]["name"])
    claimed = {str(s.get("sandboxName")) for s in bound.values()}
    return all(
        routed.get(service) == names and len(names) == REPLICAS and not names & claimed
        for service, names in running.items()
    )


def steady(objs: Any, api: client.ApiClient) -> bool:
    """What agents would do (a member bound to a node starts Running with an IP), then
    whether every claim is Bound and every Service routes exactly its pool's members
    (``settled``; read in that order: claims, members, Services)."""
    bound = claims(objs)
    members = objs.list_namespaced_custom_object(
        GROUP, VERSION, POOL_NS, "sandboxes", label_selector=POOL_LABEL
    )["items"]
    started = False
    for m in members:
        phase = (m.get("status") or {}).get("phase")
        if m["spec"].get("nodeName") and phase in (None, "Pending", "Scheduled"):
            i = next(ADDRESSES)
            objs.patch_namespaced_custom_object_status(
                GROUP, VERSION, POOL_NS, "sandboxes", m["metadata"]["name"],
                {"status": {"phase": "Running", "ip": f"10.77.{i // 250}.{i % 250 + 1}"}},
            )  # fmt: skip
            started = True
    if started:
        return False  # their routing is the pool's next pass: look again
    return settled(members, routed_members(client.DiscoveryV1Api(api)), bound)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="M=150,000 / N=5,000")
    parser.add_argument("--sandboxes", type=int, default=15_000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument(
        "--congested",
        type=float,
        default=0,
        help="bytes a second a connection the restarted operator reads (0: a direct path)",
    )
    parser.add_argument("--skip-outage", action="store_true", help="only the restart rows")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.full:
        args.sandboxes, args.nodes = 150_000, 5_000
    started = time.monotonic()
    bench = Recovery(Path(tempfile.mkdtemp(prefix="sl-recovery-")))
    try:
        bench.restart(args.nodes, args.sandboxes, args.congested)
        if not args.skip_outage:
            bench.outage()
    finally:
        bench.down()
        print(f"recovery run took {time.monotonic() - started:.0f}s, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(bench.rows, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # Stopped with SIGTERM: unwind, so the control planes stop and the rows are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
