"""``sandlot purge``: remove every sandlot object from the cluster, for uninstalling.

The chart runs it from two hook Jobs of ``helm uninstall``:

- ``purge --workloads`` (pre-delete, while the operator and the agents still run):
  cordons every SandboxNode so its agent stops each of its sandboxes gracefully
  and nothing new is placed, waits until no sandbox is still live on a node whose
  agent renews its Lease (the agent writes ``Stopped`` only after the container is
  torn down, so this is the moment the containers are gone; see
  ``sandlot.policy.purge`` for why deleting alone is not enough), then deletes every
  SandboxPool, Sandbox, SandboxSnapshot and CachePrune in every namespace and waits
  until none is left (the operator lets a snapshot go once no sandbox forks from
  it). Deleting sandboxes whose containers still run would leave those containers
  behind once the DaemonSet is gone.
- ``purge --nodes`` (post-delete, once the operator and the agents are gone):
  strips the operator's finalizer from every SandboxNode, deletes it, and deletes
  the agents' node Leases in sandlot's namespace.

The agent creates its SandboxNode only at its own start (``Agent.start``); while it
runs it only patches the node's status, which fails on a deleted node instead of
re-creating it. A restarting agent would register again, which is why the nodes go
in the post-delete hook, after the DaemonSet.

Both wait with a deadline, print a progress line when the count changes (and
every ``--progress-every``), and exit 1 on timeout naming what is left. Nothing
happens without ``--yes``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sandlot.adapters import purge
from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Objects
from sandlot.api.common import CACHEPRUNES, CLAIMS, NODES, POOLS, SANDBOXES, SNAPSHOTS
from sandlot.api.errors import UsageError
from sandlot.api.settings import parse_duration
from sandlot.cli.options import duration
from sandlot.policy.purge import awaiting_stop, live_agents

POLL_INTERVAL = 1.0
SHOWN = 10
KIND_NAMES = {
    CLAIMS: "SandboxClaims",
    POOLS: "SandboxPools",
    SANDBOXES: "Sandboxes",
    SNAPSHOTS: "SandboxSnapshots",
    CACHEPRUNES: "CachePrunes",
    NODES: "SandboxNodes",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "purge",
        help="delete every sandlot object in the cluster (for uninstalling)",
        description="Delete sandlot's objects cluster-wide. --workloads: cordon every "
        "SandboxNode, wait until the agents have stopped the sandboxes, then delete every "
        "SandboxPool, Sandbox, SandboxSnapshot and CachePrune; run it while the operator and the agents still "
        "run. --nodes: delete every SandboxNode (finalizers removed first) and the agents' "
        "node Leases; run it once the agents are gone.",
    )
    p.add_argument(
        "--workloads", action="store_true", help="pools, sandboxes, snapshots, CachePrunes"
    )
    p.add_argument("--nodes", action="store_true", help="SandboxNodes and node Leases")
    p.add_argument("--yes", action="store_true", help="confirm: this deletes cluster-wide")
    p.add_argument(
        "--wait", default="120s", type=duration, help="how long to wait for it to finish (120s)"
    )
    p.add_argument(
        "--progress-every",
        default="10s",
        type=duration,
        help="repeat the progress line this often (10s)",
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("SANDLOT_NAMESPACE", "sandlot-system"),
        help="sandlot's namespace, where the agents' node Leases live "
        "[env SANDLOT_NAMESPACE; default sandlot-system]",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    p.set_defaults(func=run_purge)


class Progress:
    """Prints a line when it changes, or every ``every`` seconds otherwise."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.last_line: str | None = None
        self.last_print = 0.0

    def show(self, line: str) -> None:
        now = time.monotonic()
        if line != self.last_line or now - self.last_print >= self.every:
            print(line, flush=True)
            self.last_line, self.last_print = line, now


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN]) + (" ..." if len(names) > SHOWN else "")


def _until(deadline: float, step: Callable[[], bool], on_timeout: Callable[[], None]) -> bool:
    """Run ``step`` until it returns True (done) or the deadline passes."""
    while True:
        if step():
            return True
        now = time.monotonic()
        if now >= deadline:
            on_timeout()
            return False
        time.sleep(min(POLL_INTERVAL, max(deadline - now, 0.05)))


def purge_workloads(
    objects: Objects, namespace: str, deadline: float, progress: Progress, wait: str
) -> bool:
    waiting: list[str] = []

    def stopped() -> bool:
        cordoned = purge.cordon_all(objects)
        if cordoned:
            print(f"cordoned {len(cordoned)} SandboxNodes: {_shown(cordoned)}", flush=True)
        live = live_agents(purge.agent_leases(objects, namespace), datetime.now(UTC))
        waiting[:] = awaiting_stop(purge.sandbox_refs(objects), live)
        if waiting:
            progress.show(
                f"{len(waiting)} sandboxes still being stopped by the agents of "
                f"{len(live)} live nodes"
            )
        return not waiting

    def stop_timeout() -> None:
        print(
            f"sandlot: purge timed out after {wait}: {len(waiting)} sandboxes not stopped "
            f"by their agents: {_shown(waiting)}",
            flush=True,
        )

    if not _until(deadline, stopped, stop_timeout):
        return False
    print("every sandbox on a live node is stopped", flush=True)

    left: dict[str, list[purge.Item]] = {}

    def gone() -> bool:
        left.clear()
        for plural in purge.WORKLOADS:
            items = purge.list_items(objects, plural)
            if items:
                left[plural] = items
            for item in items:
                if not item.deleting:
                    purge.delete(objects, item)
        if left:
            progress.show(
                "left: " + ", ".join(f"{len(v)} {KIND_NAMES[k]}" for k, v in left.items())
            )
        return not left

    def delete_timeout() -> None:
        names = [f"{KIND_NAMES[k]} {i.key}" for k, v in left.items() for i in v]
        print(f"sandlot: purge timed out after {wait}: left {_shown(names)}", flush=True)

    if not _until(deadline, gone, delete_timeout):
        return False
    print("no SandboxPool, Sandbox, SandboxSnapshot or CachePrune left", flush=True)
    return True


def purge_nodes(
    objects: Objects, namespace: str, deadline: float, progress: Progress, wait: str
) -> bool:
    left: list[purge.Item] = []

    def gone() -> bool:
        left[:] = purge.list_items(objects, NODES)
        for item in left:
            # Finalizers first: the operator that would release them is gone.
            if item.finalizers:
                purge.remove_finalizers(objects, item)
            if not item.deleting:
                purge.delete(objects, item)
        if left:
            progress.show(f"left: {len(left)} SandboxNodes")
        return not left

    def timeout() -> None:
        names = [i.name for i in left]
        print(
            f"sandlot: purge timed out after {wait}: left SandboxNodes {_shown(names)}", flush=True
        )

    if not _until(deadline, gone, timeout):
        return False
    leases = sorted(purge.agent_leases(objects, namespace))
    for name in leases:
        purge.delete_lease(objects, namespace, name)
    print(f"no SandboxNode left; deleted {len(leases)} node Leases in {namespace}", flush=True)
    return True


def run_purge(args: argparse.Namespace) -> int:
    if not (args.workloads or args.nodes):
        raise UsageError("say what to purge: --workloads, --nodes, or both")
    if not args.yes:
        what = " and ".join(
            w
            for w, on in (
                ("every SandboxPool, Sandbox, SandboxSnapshot and CachePrune", args.workloads),
                ("every SandboxNode", args.nodes),
            )
            if on
        )
        raise UsageError(f"purge deletes {what} in the cluster; add --yes to confirm")
    wait_s = parse_duration(args.wait).total_seconds()
    progress = Progress(parse_duration(args.progress_every).total_seconds())
    deadline = time.monotonic() + wait_s
    objects = Objects(load_api_client(args.kubeconfig))
    try:
        if args.workloads and not purge_workloads(
            objects, args.namespace, deadline, progress, args.wait
        ):
            return 1
        if args.nodes and not purge_nodes(objects, args.namespace, deadline, progress, args.wait):
            return 1
    finally:
        objects.api.close()
    return 0
