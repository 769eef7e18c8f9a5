"""Operator memory under steady churn: RSS after N minutes over RSS at its start.

kopf has a known leak when timers patch; this runs the real operator against a
private control plane with a fleet whose sandboxes keep coming and going (a pool
scaled up and down, sandboxes set Running then deleted) and nodes whose leases
lapse and recover, and prints RSS(end) / RSS(start after warm-up).

    .venv/bin/python bench/churn.py [--minutes 30] [--nodes 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from kubernetes import client
from tests.support.operator import AgentLease

from bench.nodehealth import Bench, rss_kb
from sandlot.api import GROUP, VERSION


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the first RSS")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    bench = Bench(Path(tempfile.mkdtemp(prefix="sl-churn-")))
    objs: Any = bench.objs
    leases: list[AgentLease] = []
    op = None
    try:
        names = [f"churn-{i}" for i in range(args.nodes)]
        for n in names:
            bench.node(n)
            leases.append(AgentLease(bench.api, bench.lease_ns, n, duration=4, every=1.0))
        op = bench.operator("--grace-period", "5s", "--resync-interval", "5s")
        deadline = time.monotonic() + args.warmup + args.minutes * 60
        start_rss = None
        started = time.monotonic()
        cycle = 0
        while time.monotonic() < deadline:
            cycle += 1
            node = names[cycle % len(names)]
            batch = [f"c{cycle}-{i}" for i in range(20)]
            for name in batch:
                objs.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    bench.ns,
                    "sandboxes",
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "Sandbox",
                        "metadata": {"name": name},
                        "spec": {"image": "example.test/busybox:1", "nodeName": node},
                    },
                )
                objs.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    bench.ns,
                    "sandboxes",
                    name,
                    {"status": {"phase": "Running", "ip": "10.0.0.1"}},
                )
            # every fifth cycle one node's lease lapses long enough to be reaped
            lease = leases[cycle % len(leases)]
            if cycle % 5 == 0:
                lease.pause()
            elif not lease._running.is_set():
                lease.resume()
            time.sleep(2)
            for name in batch:
                with contextlib.suppress(client.ApiException):
                    objs.delete_namespaced_custom_object(
                        GROUP, VERSION, bench.ns, "sandboxes", name
                    )
            if start_rss is None and time.monotonic() - started >= args.warmup:
                start_rss = rss_kb(op.proc.pid)
                print(
                    f"RSS after {args.warmup:.0f}s warm-up: {start_rss / 1024:.1f} MiB", flush=True
                )
        end_rss = rss_kb(op.proc.pid)
        ratio = end_rss / (start_rss or end_rss)
        print(
            f"RSS after {args.minutes:g} more minutes ({cycle} churn cycles): "
            f"{end_rss / 1024:.1f} MiB; ratio {ratio:.3f} (target < 1.05)",
            flush=True,
        )
        rows = [
            {
                "benchmark": f"operator RSS after {args.minutes:g} min of churn / at start",
                "value": round(ratio, 4),
                "target": "< 1.05",
                "ok": ratio < 1.05,
                "detail": f"{(start_rss or 0) / 1024:.1f} -> {end_rss / 1024:.1f} MiB, "
                f"{cycle} cycles of 20 sandboxes, {args.nodes} nodes",
            }
        ]
        if args.json:
            args.json.write_text(json.dumps(rows))
    finally:
        for lease in leases:
            lease.stop()
        if op is not None:
            op.stop()
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
