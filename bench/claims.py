"""Claim-to-bound latency with a warm pool, against a cold start.

A local control plane, the real operator (a process) and one real agent on a
private containerd. A pool keeps ``--replicas`` members Running. Each round
creates a SandboxClaim on it and times create -> status Bound (seen on a watch
of the claims), then waits until the pool is warm again. The cold start is a
Sandbox created the same way without a pool, timed create -> Running. Prints
p50/p99 of both and their ratio; the target is a claim p99 under 100 ms.

    sudo .venv/bin/python bench/claims.py [--claims 50] [--cold 10] [--replicas 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import watch
from prometheus_client import CollectorRegistry
from tests.support.containerd import start_private_containerd

from bench.nodehealth import Bench
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.api import GROUP, VERSION
from sandlot.devtools.ociarchive import build_image_archive, import_archive

IMAGE = "docker.io/sandlot/bench-claims:1"
SLEEPER = ["sh", "-c", 'trap "exit 0" TERM; sleep 1000 & wait']
TARGET_MS = 100.0


class FirstSeen:
    """Watches a namespace's objects of one kind; records when each first met ``done``."""

    def __init__(self, bench: Bench, plural: str, done: Any) -> None:
        self.bench, self.plural, self.done = bench, plural, done
        self.seen: dict[str, float] = {}
        self._cond = threading.Condition()
        self._watch = watch.Watch()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self._stream()
        except Exception as e:  # the control plane going away at the end
            print(f"{self.plural} watch ended: {type(e).__name__}", flush=True)

    def _stream(self) -> None:
        for event in self._watch.stream(
            self.bench.objs.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.bench.ns,
            self.plural,
        ):
            obj = event["object"]
            if self.done(obj):
                with self._cond:
                    self.seen.setdefault(obj["metadata"]["name"], time.monotonic())
                    self._cond.notify_all()

    def wait(self, name: str, timeout: float) -> float:
        with self._cond:
            if not self._cond.wait_for(lambda: name in self.seen, timeout):
                raise TimeoutError(f"{self.plural}/{name} not done within {timeout:g}s")
            return self.seen[name]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--cold", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sl-claims-"))
    containerd = start_private_containerd()
    bench = Bench(work)
    agent: Agent | None = None
    try:
        ctr_ns = f"bench-{uuid.uuid4().hex[:6]}"
        archive = work / "busybox.tar"
        build_image_archive(archive, IMAGE)
        import_archive(containerd.address, ctr_ns, archive, timeout=120)
        agent = Agent(
            AgentSettings(
                node_name="bench-claims",
                namespace=bench.lease_ns,
                containerd_address=containerd.address,
                containerd_namespace=ctr_ns,
                containerd_root=str(containerd.root),
                capacity=args.replicas + args.claims + args.cold + 5,
                metrics_port=0,
                log_dir=str(work / "logs"),
                node_address="127.0.0.1",
                sync_interval="0.05s",
                gc_disabled=True,
            ),
            bench.api,
            registry=CollectorRegistry(),
        )
        assert agent.start(), "the agent did not start"
        op = bench.operator("--resync-interval", "5s")
        bench.wait(op.is_leader, 60, "the operator to lead")
        bench.wait(lambda: bench.node_phase("bench-claims") == "Ready", 60, "the node Ready")

        running = FirstSeen(
            bench, "sandboxes", lambda o: (o.get("status") or {}).get("phase") == "Running"
        )
        bound = FirstSeen(
            bench, "sandboxclaims", lambda o: (o.get("status") or {}).get("phase") == "Bound"
        )
        spec = {"image": IMAGE, "command": SLEEPER, "terminationGracePeriodSeconds": 0}

        cold: list[float] = []
        for i in range(args.cold):
            name = f"cold-{i}"
            began = time.monotonic()
            bench.objs.create_namespaced_custom_object(
                GROUP,
                VERSION,
                bench.ns,
                "sandboxes",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Sandbox",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
            cold.append((running.wait(name, 60) - began) * 1000)

        bench.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            bench.ns,
            "sandboxpools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxPool",
                "metadata": {"name": "warm"},
                "spec": {"replicas": args.replicas, "template": {"spec": spec}},
            },
        )

        def warm() -> bool:
            pool = bench.objs.get_namespaced_custom_object(
                GROUP, VERSION, bench.ns, "sandboxpools", "warm"
            )
            return (pool.get("status") or {}).get("running") == args.replicas

        claims: list[float] = []
        for i in range(args.claims):
            bench.wait(warm, 60, "the pool to be warm")
            name = f"claim-{i}"
            began = time.monotonic()
            bench.objs.create_namespaced_custom_object(
                GROUP,
                VERSION,
                bench.ns,
                "sandboxclaims",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "SandboxClaim",
                    "metadata": {"name": name},
                    "spec": {"poolName": "warm"},
                },
            )
            claims.append((bound.wait(name, 30) - began) * 1000)

        c50, c99 = pct(claims, 0.5), pct(claims, 0.99)
        k50, k99 = pct(cold, 0.5), pct(cold, 0.99)
        print(f"claim-to-bound: p50 {c50:.1f} ms, p99 {c99:.1f} ms over {len(claims)} claims")
        print(
            f"cold start (create -> Running): p50 {k50:.1f} ms, p99 {k99:.1f} ms over {len(cold)}"
        )
        print(
            f"ratio claim p50 / cold p50 = {c50 / k50:.3f}; mean claim {statistics.mean(claims):.1f} ms"
        )
        row = {
            "benchmark": "claim-to-bound p99, warm pool (ms)",
            "value": round(c99, 2),
            "target": f"< {TARGET_MS:g}",
            "ok": c99 < TARGET_MS,
            "detail": f"p50 {c50:.1f} ms; cold start p50 {k50:.0f} ms (ratio {c50 / k50:.3f})",
        }
        if args.json:
            args.json.write_text(json.dumps([row]))
        op.stop()
    finally:
        if agent is not None:
            agent.shutdown()
        bench.close()
        containerd.stop()
        containerd.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
