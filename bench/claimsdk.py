"""The SDK's ``claim()`` to first ``run()``, for ``bench/claims.py --burst``.

One real node on the bench's control plane (``bench.streams.real_node``: a private
containerd, the agent and the stream gateway behind the API server) and the real
operator keeping a small warm pool on it, kept off the bench's played nodes by a
label only the real node has. Each round claims a member through
``sandlot.client.Client.claim``, runs ``true`` in it (through the API server, the
gateway and the agent) and times the two together; then a second ``run`` on the
claimed sandbox gives the exec floor of that round, and ``terminate`` releases it.
The pool is warm again before the next round.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.claims import create, pct
from bench.nodehealth import Bench
from bench.streams import real_node
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import POOL_LABEL
from sandlot.client import Client

NODE = "bench-sdk"
IMAGE = "docker.io/sandlot/bench-sdk:1"
SDK_POOL = "sdk"
LABEL = "bench.sandlot.dev/real-node"
TARGET_MS = 100.0


def running_members(bench: Bench, pool: str) -> int:
    members = bench.objs.list_namespaced_custom_object(
        GROUP, VERSION, bench.ns, "sandboxes", label_selector=f"{POOL_LABEL}={pool}"
    )["items"]
    return sum(
        1
        for m in members
        if (m.get("status") or {}).get("phase") == "Running"
        and not m["metadata"].get("deletionTimestamp")
    )


def measure_sdk(
    bench: Bench, work: Path, rounds: int, members: int
) -> tuple[list[float], list[float], list[float]]:
    """Claim-to-first-run, claim-alone and bare-run times (ms) over ``rounds``
    rounds. The caller runs the operator; nothing else may set sandboxes Running."""
    with real_node(bench, work, NODE, IMAGE) as _:
        bench.wait(lambda: _node_exists(bench), 60, f"the agent to register SandboxNode {NODE}")
        bench.objs.patch_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", NODE, {"metadata": {"labels": {LABEL: "true"}}}
        )
        template = {
            "image": IMAGE,
            "command": ["sleep", "100000"],
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {LABEL: "true"},
        }
        create(bench, "sandboxpools", "SandboxPool", SDK_POOL,
               {"replicas": members, "template": {"spec": template}})  # fmt: skip
        claimed: list[float] = []
        claims: list[float] = []
        floor: list[float] = []
        with Client(bench.plane.kubeconfig, namespace=bench.ns) as sdk:
            for i in range(rounds + 1):  # round 0 warms the paths and is not counted
                bench.wait(
                    lambda: running_members(bench, SDK_POOL) >= members,
                    120,
                    f"pool {SDK_POOL}: {members} members Running on {NODE}",
                )
                began = time.monotonic()
                sb = sdk.claim(SDK_POOL, timeout=60)
                claim_alone = time.monotonic() - began
                try:
                    first = sb.run(["true"], timeout=60)
                    took = time.monotonic() - began
                    began = time.monotonic()
                    again = sb.run(["true"], timeout=60)
                    bare = time.monotonic() - began
                finally:
                    sb.terminate()
                if (first.exit_code, again.exit_code) != (0, 0):
                    raise RuntimeError(f"true exited {first.exit_code}, {again.exit_code}")
                if i:
                    claimed.append(took * 1000)
                    claims.append(claim_alone * 1000)
                    floor.append(bare * 1000)
        bench.objs.delete_namespaced_custom_object(GROUP, VERSION, bench.ns, "sandboxpools",
                                                   SDK_POOL)  # fmt: skip
    return claimed, claims, floor


def _node_exists(bench: Bench) -> bool:
    nodes = bench.objs.list_cluster_custom_object(GROUP, VERSION, "sandboxnodes")["items"]
    return any(n["metadata"]["name"] == NODE for n in nodes)


def sdk_row(
    bench: Bench, claimed: list[float], claims: list[float], floor: list[float], members: int
) -> None:
    p50, floor_p50 = pct(claimed, 0.5), pct(floor, 0.5)
    target = floor_p50 + TARGET_MS
    bench.row("SDK claim() to first run() p50 (ms)", p50, f"<= {target:.1f}", p50 <= target,
              f"exec floor p50 {floor_p50:.1f} ms + {TARGET_MS:g}; {len(claimed)} rounds on a "
              f"warm pool of {members} on one real node, p99 {pct(claimed, 0.99):.1f} ms, "
              f"claim() alone p50 {pct(claims, 0.5):.1f} ms")  # fmt: skip
