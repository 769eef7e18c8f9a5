"""Sandbox start latency, create -> Running, against the floor measured in the same run.

Starts a private containerd (a busybox image imported), a local control plane,
the real operator (it schedules) and an in-process agent with its default
pacing. Sandboxes are created without a node; the time is from just before the
create call to the moment a watch in this process sees ``status.phase: Running``.

1. 20 sandboxes one at a time (each waits for the previous one's Running);
2. 100 sandboxes created at once (from 16 threads), ``--burst-rounds`` times.

The floor, measured in the same run with the same image: containerd create +
start of a container, plus one status write to a Sandbox. For 1 it is done one
at a time; for 2, 100 of them at once on the agent's concurrency (its worker
pool), each timed from the common start, as the sandboxes are. Sandbox and floor
are interleaved so that both see the same machine: one at a time, each sandbox
start is followed by one floor start, both after the same quiet pause; at once,
each round is a floor burst and a sandbox burst (the order alternating between
rounds), the floor's containers and the round's sandboxes removed after it.

Rows: p50 and p99 of each run (targets p50 < 150 ms, p99 < 300 ms), with the
floor's p50 and p99 beside them; each run's p50 over the floor's (target <= 1.2);
then, for each run, a start's mean time in each of its phases
(``sandlot_agent_start_phase_seconds``) and what is left of its mean
create -> Running outside them.

    sudo .venv/bin/python bench/start_latency.py [--serial 20] [--burst 100] [--burst-rounds 2]
        [--json rows.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client, watch
from prometheus_client import CollectorRegistry
from tests.support.containerd import scratch_spec, start_private_containerd
from tests.support.operator import OperatorProcess

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.main import Agent
from sandlot.agent.metrics import START_PHASES
from sandlot.agent.netsettings import NetworkMode
from sandlot.agent.settings import AgentSettings
from sandlot.agent.teardown import teardown_many
from sandlot.api import GROUP, VERSION
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive

IMAGE = "docker.io/sandlot/bench-start:1"
COMMAND = ["sleep", "100000"]
NS = "bench"
LEASE_NS = "sandlot-system"
P50_TARGET = 0.150
P99_TARGET = 0.300
RATIO_TARGET = 1.2  # a start's p50 over the floor's, measured interleaved
QUIET = 1.5  # seconds before each start one at a time: each change arrives alone


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (p99 of 20 values is the largest)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


class RunningWatch:
    """When each Sandbox of the namespace was first seen Running (monotonic seconds)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._objs: Any = client.CustomObjectsApi(api)
        self.running: dict[str, float] = {}
        self.scheduled: dict[str, float] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self._objs.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NS,
                    "sandboxes",
                    resource_version=version,
                    timeout_seconds=30,
                ):
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    phase = (obj.get("status") or {}).get("phase")
                    if phase == "Scheduled":
                        self.scheduled.setdefault(obj["metadata"]["name"], time.monotonic())
                    if phase == "Running":
                        with self._cond:
                            self.running.setdefault(obj["metadata"]["name"], time.monotonic())
                            self._cond.notify_all()
                    if self._stop.is_set():
                        break
            except Exception:  # a watch that expired restarts from the list
                version = ""
                self._stop.wait(0.1)

    def wait(self, names: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(n in self.running for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.running]
                    raise TimeoutError(f"{len(missing)} sandboxes not Running: {missing[:5]}")
                self._cond.wait(left)
            return {n: self.running[n] for n in names}

    def stop(self) -> None:
        self._stop.set()


def create(objs: Any, name: str) -> float:
    began = time.monotonic()
    objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"image": IMAGE, "command": COMMAND},
        },
    )
    return began


class Floor:
    """containerd create + start of the image, plus one status write, done directly."""

    def __init__(self, rt: ContainerdRuntime, objs: Any, target: str) -> None:
        self.rt, self.objs, self.target = rt, objs, target

    def one(self, cid: str) -> None:
        spec = scratch_spec(COMMAND, cid, host_network=False)
        self.rt.create_container(ContainerSpec(id=cid, image=IMAGE, oci_spec=spec), timeout=30)
        self.rt.start_task(cid, stdio="", timeout=30)
        self.objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, "sandboxes", self.target, {"status": {"message": cid}}
        )

    def timed(self, cid: str) -> float:
        began = time.monotonic()
        self.one(cid)
        return time.monotonic() - began

    def burst(self, count: int, workers: int, prefix: str) -> list[float]:
        began = time.monotonic()

        def timed(i: int) -> float:
            self.one(f"{prefix}-{i}")
            return time.monotonic() - began

        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(timed, range(count)))

    def clean(self) -> None:
        ids = [c.id for c in self.rt.list_containers(timeout=30) if c.id.startswith("floor-")]
        teardown_many(self.rt, ids, kill_wait=5, call_timeout=10, concurrency=8)


def ratio_row(label: str, latencies: list[float], floor: list[float]) -> dict[str, Any]:
    value = percentile(latencies, 0.5) / percentile(floor, 0.5)
    ok = value <= RATIO_TARGET
    detail = (
        f"p50 {1000 * percentile(latencies, 0.5):.0f} / {1000 * percentile(floor, 0.5):.0f} ms, "
        "interleaved in this run"
    )
    print(
        f"  create -> Running / floor p50, {label}: {value:.2f} (target <= {RATIO_TARGET}) "
        f"{'ok' if ok else 'MISSED'} - {detail}",
        flush=True,
    )
    return {
        "benchmark": f"create -> Running / floor p50, {label}",
        "value": round(value, 3),
        "target": f"<= {RATIO_TARGET}",
        "ok": ok,
        "detail": detail,
    }


def remove_sandboxes(objs: Any, rt: ContainerdRuntime, names: list[str], keep: int) -> None:
    """Delete ``names`` and wait (bounded) until the agent tore their containers down,
    leaving ``keep`` containers, so the next round starts on the same node."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: objs.delete_namespaced_custom_object(
            GROUP, VERSION, NS, "sandboxes", n), names))  # fmt: skip
    deadline = time.monotonic() + 300
    while (left := len(rt.list_containers(timeout=30))) > keep:
        if time.monotonic() > deadline:
            remaining = objs.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes")
            raise TimeoutError(
                f"{left - keep} sandboxes' containers still there after 300s; sandboxes: "
                + str([(o["metadata"]["name"], (o.get("status") or {}).get("phase"),
                        o["metadata"].get("deletionTimestamp")) for o in remaining["items"]][:5])
            )  # fmt: skip
        time.sleep(0.5)


def rows_for(label: str, latencies: list[float], floor: list[float]) -> list[dict[str, Any]]:
    rows = []
    for name, q, target in (("p50", 0.5, P50_TARGET), ("p99", 0.99, P99_TARGET)):
        value, base = percentile(latencies, q), percentile(floor, q)
        ok = value < target
        detail = (
            f"{1000 * value:.0f} ms vs floor {1000 * base:.0f} ms (containerd create + start "
            f"+ one status write); min {1000 * min(latencies):.0f}, max {1000 * max(latencies):.0f} ms"
        )
        print(
            f"  create -> Running {name}, {label}: {1000 * value:.0f} ms (target < "
            f"{1000 * target:.0f} ms) {'ok' if ok else 'MISSED'} - {detail}",
            flush=True,
        )
        rows.append(
            {
                "benchmark": f"create -> Running {name}, {label} (s)",
                "value": round(value, 4),
                "target": f"< {target:g}",
                "ok": ok,
                "detail": detail,
            }
        )
    return rows


def phase_totals(agent: Agent) -> dict[str, tuple[float, float]]:
    """(count, seconds) of each phase of the agent's starts so far."""
    totals = {}
    for phase in START_PHASES:
        sample = {"phase": phase}
        count = agent.registry.get_sample_value("sandlot_agent_start_phase_seconds_count", sample)
        seconds = agent.registry.get_sample_value("sandlot_agent_start_phase_seconds_sum", sample)
        totals[phase] = (count or 0.0, seconds or 0.0)
    return totals


def print_phases(
    label: str,
    before: dict[str, tuple[float, float]],
    after: dict[str, tuple[float, float]],
    latencies: list[float],
) -> None:
    """A start's mean time in each phase over a run, and what is left of its mean
    create -> Running (the operator's scheduling, the agent's queue, the watches)."""
    parts = []
    inside = 0.0
    for phase in START_PHASES:
        count = after[phase][0] - before[phase][0]
        seconds = after[phase][1] - before[phase][1]
        mean = seconds / count if count else 0.0
        inside += mean
        parts.append(f"{phase} {1000 * mean:.1f}")
    rest = statistics.mean(latencies) - inside
    print(
        f"  by phase, {label} (mean ms of one start): {', '.join(parts)}; "
        f"sum {1000 * inside:.1f}; the rest of create -> Running {1000 * rest:.1f}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", type=int, default=20)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument(
        "--burst-rounds", type=int, default=2, help="bursts of each kind, interleaved"
    )
    parser.add_argument(
        "--sync-burst", type=int, default=None, help="the agent's sync_burst (default: its own)"
    )
    parser.add_argument(
        "--sync-interval", default=None, help="the agent's sync_interval (default: its own)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    pacing: dict[str, Any] = {}
    if args.sync_burst is not None:
        pacing["sync_burst"] = args.sync_burst
    if args.sync_interval is not None:
        pacing["sync_interval"] = args.sync_interval

    work = Path(tempfile.mkdtemp(prefix="sl-bench-start-"))
    containerd = start_private_containerd()
    plane = ControlPlane(workdir=work / "cp")
    plane.start()
    api = load_api_client(str(plane.kubeconfig), pool_size=32)
    objs: Any = client.CustomObjectsApi(api)
    ctr_ns = f"bench-start-{uuid.uuid4().hex[:6]}"
    agent: Agent | None = None
    op: OperatorProcess | None = None
    watcher: RunningWatch | None = None
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    rows: list[dict[str, Any]] = []
    try:
        apply_crds(api, [crd_for(k) for k in KINDS])
        core = client.CoreV1Api(api)
        for ns in (NS, LEASE_NS):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        build_image_archive(work / "image.tar", IMAGE)
        import_archive(containerd.address, ctr_ns, work / "image.tar", timeout=120)

        settings = AgentSettings(
            default_ephemeral_storage_limit="",  # not about disk: no node-wide limit
            node_name="bench-node",
            namespace=LEASE_NS,
            containerd_address=containerd.address,
            containerd_namespace=ctr_ns,
            containerd_root=str(containerd.root),
            capacity=args.burst + args.serial + 10,  # a round's sandboxes go before the next
            capacity_memory="64Gi",  # the sandboxes' default limits, not this machine's memory
            metrics_port=0,
            log_dir="",
            node_address="127.0.0.1",
            network_mode=NetworkMode.HOST_ADDRESS,
            gc_disabled=True,
            **pacing,
        )
        agent = Agent(settings, api, registry=CollectorRegistry())
        assert agent.start(), "the agent did not start"
        op = OperatorProcess(plane, work, LEASE_NS)
        op.wait_metrics(60)
        deadline = time.monotonic() + 60
        while not op.is_leader():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator did not lead within 60s:\n{op.log()}")
            time.sleep(0.1)
        watcher = RunningWatch(api)

        # A first sandbox warms every path (and waits for the node to be Ready).
        create(objs, "warm-up")
        watcher.wait(["warm-up"], timeout=120)

        floor = Floor(rt, objs, "warm-up")  # its status takes the floor's writes
        serial: list[float] = []
        floor_serial: list[float] = []
        scheduled: list[float] = []
        phases_before = phase_totals(agent)
        for i in range(args.serial):
            time.sleep(QUIET)
            name = f"serial-{i}"
            began = create(objs, name)
            serial.append(watcher.wait([name], timeout=60)[name] - began)
            scheduled.append(watcher.scheduled.get(name, began) - began)
            time.sleep(QUIET)
            floor_serial.append(floor.timed(f"floor-s-{i}"))
        phases_serial = phase_totals(agent)
        floor.clean()
        remove_sandboxes(objs, rt, [f"serial-{i}" for i in range(args.serial)], keep=1)

        burst: list[float] = []
        floor_burst: list[float] = []
        burst_phases: dict[str, tuple[float, float]] = {}
        for r in range(args.burst_rounds):
            floor_first = r % 2 == 0
            if floor_first:
                floor_burst += floor.burst(args.burst, settings.teardown_concurrency, f"floor-b{r}")
                floor.clean()
            before = phase_totals(agent)
            names = [f"burst-{r}-{i}" for i in range(args.burst)]
            with ThreadPoolExecutor(16) as pool:
                began = time.monotonic()
                list(pool.map(lambda n: create(objs, n), names))
            seen = watcher.wait(names, timeout=300)
            burst += [seen[n] - began for n in names]
            after = phase_totals(agent)
            for phase in START_PHASES:
                count, seconds = burst_phases.get(phase, (0.0, 0.0))
                burst_phases[phase] = (
                    count + after[phase][0] - before[phase][0],
                    seconds + after[phase][1] - before[phase][1],
                )
            remove_sandboxes(objs, rt, names, keep=1)
            if not floor_first:
                floor_burst += floor.burst(args.burst, settings.teardown_concurrency, f"floor-b{r}")
                floor.clean()
        zero = {phase: (0.0, 0.0) for phase in START_PHASES}

        print(
            f"agent: sync_interval {settings.sync_interval.total_seconds():g}s, "
            f"sync_burst {settings.sync_burst}, concurrency {settings.teardown_concurrency}"
        )
        print(
            f"  one at a time: create -> Scheduled (the operator) p50 "
            f"{1000 * percentile(scheduled, 0.5):.0f} ms, max {1000 * max(scheduled):.0f} ms"
        )
        serial_label = f"{args.serial} one at a time"
        burst_label = f"{args.burst} created at once, {args.burst_rounds} rounds"
        rows += rows_for(serial_label, serial, floor_serial)
        rows += rows_for(burst_label, burst, floor_burst)
        rows.append(ratio_row(serial_label, serial, floor_serial))
        rows.append(ratio_row(burst_label, burst, floor_burst))
        print_phases(serial_label, phases_before, phases_serial, serial)
        print_phases(burst_label, zero, burst_phases, burst)
        print(
            "  floor one at a time: p50 "
            f"{1000 * statistics.median(floor_serial):.0f} ms; "
            f"{args.burst} at once: p50 {1000 * percentile(floor_burst, 0.5):.0f} ms, "
            f"p99 {1000 * percentile(floor_burst, 0.99):.0f} ms"
        )
        if args.json:
            args.json.write_text(json.dumps(rows))
    finally:
        if watcher is not None:
            watcher.stop()
        if op is not None:
            op.stop()
        if agent is not None:
            agent.shutdown()
        with contextlib.suppress(Exception):
            ids = [c.id for c in rt.list_containers(timeout=30)]
            teardown_many(rt, ids, kill_wait=5, call_timeout=10, concurrency=8)
        rt.close()
        api.close()
        plane.stop()
        containerd.stop()
        containerd.remove()
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
