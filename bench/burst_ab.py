"""Nodes lost at once: node-health passes one at a time against side by side.

One private control plane; the node-health controller in this process over the
real ``Objects``, its Leases fed as the watch delivers them; ``--nodes`` nodes of
``--per-node`` Running sandboxes each stop renewing together. Each round runs the
controller's queue with one worker (passes one after another) and then with
``markConcurrency`` workers (side by side), each on a fleet of its own, and prints
the time from the shared deadline until every node is handled (latched).

    .venv/bin/python bench/burst_ab.py --nodes 30 --per-node 5 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from prometheus_client import CollectorRegistry
from tests.support.kube import start_private_plane

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import LeaseRecord, Objects
from sandlot.api import GROUP, VERSION
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.nodehealth import NodeHealthController
from sandlot.controllers.settings import OperatorSettings
from sandlot.policy.disruption import GuardSettings
from sandlot.policy.nodehealth import NodeHealthSettings

NS = "burst"
LEASE, GRACE = 1, 2


def create_fleet(objs: Any, tag: str, nodes: int, per_node: int) -> list[str]:
    names = [f"{tag}-n{i}" for i in range(nodes)]
    for node in names:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxNode",
                "metadata": {"name": node}, "spec": {}}  # fmt: skip
        objs.create_cluster_custom_object(GROUP, VERSION, "sandboxnodes", body)

    def sandbox(node: str, j: int) -> None:
        name = f"{node}-{j}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Sandbox", "metadata": {"name": name},
                "spec": {"image": "example.test/busybox:1", "nodeName": node}}  # fmt: skip
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", body)
        status = {"status": {"phase": "Running"}}
        objs.patch_namespaced_custom_object_status(GROUP, VERSION, NS, "sandboxes", name, status)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda a: sandbox(*a), [(n, j) for n in names for j in range(per_node)]))
    return names


def burst(api: client.ApiClient, nodes: list[str], workers: int) -> float:
    """Seconds from the shared deadline until every node is handled."""
    objs: Any = client.CustomObjectsApi(api)
    settings = OperatorSettings(
        node_health=NodeHealthSettings(
            grace_period=timedelta(seconds=GRACE), unseen_lease_duration=timedelta(seconds=GRACE)
        ),
        lease_view_max_age=timedelta(seconds=2),
        guard=GuardSettings(min_nodes=len(nodes) + 1),  # off: every node here is lost
        leader_election=False,
    )
    metrics = OperatorMetrics(CollectorRegistry())
    ctl = NodeHealthController(settings, Objects(api), metrics, is_leader=lambda: True,
                               post_event=lambda *_: None)  # fmt: skip

    async def scenario() -> float:
        runner = asyncio.create_task(ctl.queue.run(workers=workers))
        await asyncio.sleep(0)
        renewed = datetime.now(UTC)
        for node in nodes:
            ctl.on_node(None, objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node))
            ctl.on_lease("ADDED", LeaseRecord(node, node, renewed, LEASE, "1"))
        ctl.on_view_restored()
        limit = time.monotonic() + 300
        try:
            while not all(ctl.tracking[n].handled_at for n in nodes):
                if time.monotonic() > limit:
                    raise TimeoutError(f"{len(nodes)} lost nodes not handled within 300s")
                ctl.on_heard()  # the lease watch is alive; it hears no renewals
                await asyncio.sleep(0.02)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        deadline = renewed + timedelta(seconds=LEASE + GRACE)
        return (datetime.now(UTC) - deadline).total_seconds()

    return asyncio.run(scenario())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--per-node", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    side_by_side = OperatorSettings().mark_concurrency
    plane = start_private_plane(Path(tempfile.mkdtemp(prefix="sl-burst-")), namespaces=(NS,))
    try:
        api = load_api_client(str(plane.kubeconfig), pool_size=32)
        objs: Any = client.CustomObjectsApi(api)
        for rnd in range(args.rounds):
            for workers in (1, side_by_side):
                nodes = create_fleet(objs, f"r{rnd}w{workers}", args.nodes, args.per_node)
                took = burst(api, nodes, workers)
                print(f"round {rnd}, {workers:2d} worker(s): {args.nodes} nodes x {args.per_node} "
                      f"lost at once, every node handled {took:.2f}s after the deadline",
                      flush=True)  # fmt: skip
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
