"""``sandlot drain NODE`` (also ``sandlot nodes drain``; ``--move``: ``cli.drainmove``),
``sandlot uncordon NODE`` and ``sandlot nodes reap NODE``.

``drain`` marks the node unschedulable and waits, with a deadline, until no
non-terminal sandbox is left on it: the agent stops them (each ends ``Stopped``,
reason ``Drained``) and their pools replace them elsewhere. It prints a progress
line whenever the count changes (and every ``--progress-every`` otherwise), and
exits 1 on timeout naming what is left, so a script can tell a finished drain
from an abandoned one. The node stays unschedulable either way.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.nodes import (
    NodeNotFound,
    NodeNotReapable,
    live_sandboxes,
    reap_outcome,
    request_reap,
    requester,
    set_unschedulable,
)
from sandlot.adapters.objects import Objects
from sandlot.api.errors import UsageError
from sandlot.api.settings import parse_duration
from sandlot.cli.drainmove import drain_move
from sandlot.cli.options import duration

POLL_INTERVAL = 1.0
SHOWN = 10


def _add_drain(sub: Any) -> None:
    drain = sub.add_parser(
        "drain",
        help="stop (or, with --move, move) a node's sandboxes and keep new ones off it",
        description="Set spec.unschedulable on the SandboxNode and wait until its agent "
        "has stopped every sandbox there (pools replace them on other nodes); with "
        "--move, each sandbox is suspended, its state pushed, and started again on "
        "another node.",
    )
    drain.add_argument("node", metavar="NODE", help="SandboxNode name")
    drain.add_argument(
        "--timeout",
        default="5m",
        type=duration,
        help="how long to wait for the node to empty (default 5m)",
    )
    drain.add_argument(
        "--progress-every",
        default="10s",
        type=duration,
        help="repeat the progress line this often (10s)",
    )
    drain.add_argument(
        "--move",
        action="store_true",
        help="suspend each sandbox with its state pushed and start it again on another "
        "node, instead of stopping it (needs the agents' suspend_state_repository)",
    )
    drain.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    drain.set_defaults(func=run_drain)


def register(sub: Any) -> None:
    _add_drain(sub)
    uncordon = sub.add_parser(
        "uncordon",
        help="let sandboxes be scheduled on a drained node again",
        description="Clear spec.unschedulable on the SandboxNode.",
    )
    uncordon.add_argument("node", metavar="NODE", help="SandboxNode name")
    uncordon.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    uncordon.set_defaults(func=run_uncordon)

    nodes = sub.add_parser(
        "nodes", help="SandboxNode commands", description="SandboxNode commands."
    )
    commands = nodes.add_subparsers(dest="nodes_command", metavar="COMMAND", required=True)
    _add_drain(commands)  # `sandlot nodes drain`, the same as `sandlot drain`
    reap = commands.add_parser(
        "reap",
        help="declare a NotReady node lost: mark its sandboxes Dead now",
        description="Record on the SandboxNode (spec.reap) your decision that this NotReady "
        "node is lost; the operator marks its sandboxes Dead (reason ManualReap) at once, "
        "even within the grace period or while the mass-failure guard holds. The decision "
        "names the node's current NotReady episode: if the node renews its lease, it lapses.",
    )
    reap.add_argument("node", metavar="NODE", help="SandboxNode name")
    reap.add_argument("--reason", default=None, help="why, recorded with the decision")
    reap.add_argument(
        "--timeout",
        default="2m",
        type=duration,
        help="how long to wait for the operator to mark the sandboxes (default 2m)",
    )
    reap.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    reap.set_defaults(func=run_reap)


def _objects(args: argparse.Namespace) -> Objects:
    return Objects(load_api_client(args.kubeconfig))


def run_drain(args: argparse.Namespace) -> int:
    timeout = parse_duration(args.timeout).total_seconds()
    every = parse_duration(args.progress_every).total_seconds()
    objects = _objects(args)
    try:
        if getattr(args, "move", False):
            try:
                return drain_move(objects, args.node, timeout, args.timeout)
            except NodeNotFound as e:
                raise UsageError(str(e)) from e
        try:
            set_unschedulable(objects, args.node, True)
        except NodeNotFound as e:
            raise UsageError(str(e)) from e
        print(f"node {args.node} cordoned (spec.unschedulable=true)", flush=True)
        deadline = time.monotonic() + timeout
        last_count: int | None = None
        last_print = 0.0
        while True:
            left = live_sandboxes(objects, args.node)
            if not left:
                print(f"node {args.node} drained", flush=True)
                return 0
            now = time.monotonic()
            if len(left) != last_count or now - last_print >= every:
                print(f"{len(left)} sandboxes still on {args.node}", flush=True)
                last_count, last_print = len(left), now
            if now >= deadline:
                shown = ", ".join(left[:SHOWN]) + (" ..." if len(left) > SHOWN else "")
                print(
                    f"sandlot: drain of {args.node} timed out after {args.timeout}: "
                    f"{len(left)} sandboxes left: {shown}",
                    flush=True,
                )
                return 1
            time.sleep(min(POLL_INTERVAL, max(deadline - now, 0.05)))
    finally:
        objects.api.close()


def run_uncordon(args: argparse.Namespace) -> int:
    objects = _objects(args)
    try:
        set_unschedulable(objects, args.node, False)
    except NodeNotFound as e:
        raise UsageError(str(e)) from e
    finally:
        objects.api.close()
    print(f"node {args.node} uncordoned", flush=True)
    return 0


def run_reap(args: argparse.Namespace) -> int:
    timeout = parse_duration(args.timeout).total_seconds()
    objects = _objects(args)
    try:
        try:
            since = request_reap(objects, args.node, requester(objects), args.reason)
        except (NodeNotFound, NodeNotReapable) as e:
            raise UsageError(str(e)) from e
        print(f"node {args.node} declared lost (NotReady since {since})", flush=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                done = reap_outcome(objects, args.node, since)
            except (NodeNotFound, NodeNotReapable) as e:
                print(f"sandlot: {e}", flush=True)
                return 1
            if done is not None:
                handled_at, count = done
                print(f"node {args.node}: {count} sandboxes marked Dead at {handled_at}")
                return 0
            if time.monotonic() >= deadline:
                print(
                    f"sandlot: the operator has not acted on the decision within "
                    f"{args.timeout} (is it running and leading?); it stays recorded",
                    flush=True,
                )
                return 1
            time.sleep(POLL_INTERVAL)
    finally:
        objects.api.close()
