"""``sandlot pool status POOL``: wait for a pool's rollout, as ``kubectl rollout
status`` does for a Deployment.

It prints a line whenever the progress changes and exits 0 once every member is
from the current template and Running (``policy.pools.rollout_progress``
decides), or 1 when ``--timeout`` passes first, saying where it stood. With
``--no-wait`` it prints the current state once and exits 0 if done, 1 if not.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Objects
from sandlot.adapters.workloads import read_pool
from sandlot.api.errors import UsageError
from sandlot.api.settings import parse_duration
from sandlot.cli.options import duration
from sandlot.policy.pools import RolloutProgress, rollout_progress

POLL_INTERVAL = 1.0


def register(sub: Any) -> None:
    pool = sub.add_parser("pool", help="SandboxPool commands", description="SandboxPool commands.")
    commands = pool.add_subparsers(dest="pool_command", metavar="COMMAND", required=True)
    status = commands.add_parser(
        "status",
        help="wait for a pool's rollout to finish",
        description="Watch a SandboxPool until every member is from its current template "
        "and Running (like `kubectl rollout status`); exit 1 on timeout.",
    )
    status.add_argument("pool", metavar="POOL", help="SandboxPool name")
    status.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    status.add_argument(
        "--timeout", default="5m", type=duration, help="how long to wait (default 5m)"
    )
    status.add_argument(
        "--no-wait", dest="wait", action="store_false", help="report once, do not wait"
    )
    status.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    status.set_defaults(func=run_status)


def _progress(objects: Objects, namespace: str, name: str) -> RolloutProgress:
    body = read_pool(objects, namespace, name)
    if body is None:
        raise UsageError(f'SandboxPool "{name}" not found in namespace {namespace}')
    spec = body.get("spec") or {}
    return rollout_progress(
        name,
        int(body["metadata"].get("generation") or 0),
        int(spec.get("replicas", 1)),
        body.get("status") or {},
    )


def run_status(args: argparse.Namespace) -> int:
    api = load_api_client(args.kubeconfig)
    try:
        objects = Objects(api)
        deadline = time.monotonic() + parse_duration(args.timeout).total_seconds()
        last = ""
        while True:
            progress = _progress(objects, args.namespace, args.pool)
            if progress.message != last:
                print(progress.message, flush=True)
                last = progress.message
            if progress.done:
                return 0
            if not args.wait:
                return 1
            if time.monotonic() >= deadline:
                print(f"error: timed out after {args.timeout} waiting for the rollout", flush=True)
                return 1
            time.sleep(POLL_INTERVAL)
    finally:
        api.close()
