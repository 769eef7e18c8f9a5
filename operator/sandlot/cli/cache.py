"""``sandlot cache clear containerd [--all] [--node N ...]``: prune nodes' image caches.

The command creates a CachePrune and waits, with a deadline, until every
targeted node has a result: written by the node's agent, or by the operator for
a node that does not exist or whose agent is not running. It then prints one line
per node (the pass that ran, what it removed and freed, what it held back and
why) and exits non-zero when any node reported an error or did not report in
time, naming those nodes. ``--all`` is carried in the request itself
(``spec.all``), so the flag reaches each node's collector unchanged.

With ``--node``, the named nodes are the targets from the start; without it the
operator resolves "every node" into ``status.targets``, so that wait needs the
operator running.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from sandlot.adapters.cacheprune import CachePruneError, CachePrunes
from sandlot.api.cacheprune import CachePrune, CachePrunePhase, NodePruneResult
from sandlot.api.errors import UsageError
from sandlot.api.settings import parse_duration
from sandlot.cli.options import duration

POLL_SECONDS = 0.5
EXIT_OK = 0
EXIT_FAILED = 1


def register(sub: Any) -> None:
    cache = sub.add_parser("cache", help="node caches")
    cache_sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    clear = cache_sub.add_parser("clear", help="prune a cache on nodes")
    what = clear.add_subparsers(dest="cache_target", metavar="CACHE", required=True)
    ctrd = what.add_parser(
        "containerd",
        help="prune containerd's image cache",
        description="Prune containerd's image cache on nodes: the watermark pass now, or "
        "with --all every image not in use, pinned or a live job's. Waits for every node's "
        "result, prints it, and exits 1 if any node failed or did not report in time.",
    )
    ctrd.add_argument(
        "--all",
        dest="all_",
        action="store_true",
        help="remove every unprotected image, whatever the disk usage (the forced pass)",
    )
    ctrd.add_argument(
        "--node",
        dest="nodes",
        action="append",
        default=[],
        metavar="NODE",
        help="a node to prune (repeatable; default: every SandboxNode)",
    )
    ctrd.add_argument(
        "--timeout",
        default="120s",
        type=duration,
        help="how long to wait for the nodes' results (e.g. 120s, 5m) [default 120s]",
    )
    ctrd.add_argument(
        "--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)"
    )
    ctrd.set_defaults(func=run_clear)


def run_clear(args: argparse.Namespace) -> int:
    timeout = parse_duration(args.timeout).total_seconds()
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout!r}")
    try:
        with CachePrunes.connect(args.kubeconfig) as prunes:
            return clear_containerd(prunes, all_=args.all_, nodes=args.nodes, timeout=timeout)
    except CachePruneError as exc:
        print(f"sandlot: error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def clear_containerd(
    prunes: CachePrunes,
    *,
    all_: bool,
    nodes: Sequence[str],
    timeout: float,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Create the request, wait for its results, print them; the exit code."""
    out = out or sys.stdout
    wanted = list(dict.fromkeys(n for n in nodes if n))
    request = prunes.create(all_=all_, nodes=wanted)
    name = str(request.metadata.get("name"))
    kind = "forced" if all_ else "watermark"
    scope = ", ".join(wanted) if wanted else "every node"
    print(f"cacheprune/{name}: {kind} pass requested on {scope}", file=out, flush=True)

    deadline = clock() + timeout
    shown = ""
    current: CachePrune = request
    while True:
        got = prunes.get(name)
        if got is None:
            print(f"sandlot: error: cacheprune/{name} was deleted while waiting", file=sys.stderr)
            return EXIT_FAILED
        current = got
        targets = _targets(current, wanted)
        results = current.status.results if current.status else {}
        if targets is not None:
            reported = [t for t in targets if t in results]
            progress = f"{len(reported)}/{len(targets)} nodes reported"
            if progress != shown:
                print(progress, file=out, flush=True)
                shown = progress
            if len(reported) == len(targets):
                break
        if clock() >= deadline:
            return _timed_out(name, current, targets, timeout, out)
        sleep(POLL_SECONDS)

    assert targets is not None
    if not targets:
        print("no SandboxNodes exist: nothing to prune", file=out)
        return EXIT_OK
    print(format_table(targets, results), file=out)
    failed = [t for t in targets if results[t].error]
    if failed:
        print(
            f"sandlot: error: cacheprune/{name}: {len(failed)} of {len(targets)} nodes "
            f"failed: {', '.join(failed)}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def _targets(request: CachePrune, wanted: Sequence[str]) -> list[str] | None:
    """The nodes to wait for; None while "every node" is not resolved yet."""
    status = request.status
    if status is not None and status.phase != CachePrunePhase.PENDING:
        return list(status.targets)
    if wanted:
        return list(wanted)
    return None


def _timed_out(
    name: str,
    request: CachePrune,
    targets: list[str] | None,
    timeout: float,
    out: TextIO,
) -> int:
    results = request.status.results if request.status else {}
    if targets is None:
        print(
            f"sandlot: error: cacheprune/{name}: no node list after {timeout:g}s: the operator "
            "resolves 'every node' and has not (is it running?); name nodes with --node",
            file=sys.stderr,
        )
        return EXIT_FAILED
    answered = [t for t in targets if t in results]
    if answered:
        print(format_table(answered, results), file=out)
    silent = [t for t in targets if t not in results]
    print(
        f"sandlot: error: cacheprune/{name}: timed out after {timeout:g}s: "
        f"{len(silent)} of {len(targets)} nodes did not report: {', '.join(silent)}",
        file=sys.stderr,
    )
    return EXIT_FAILED


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


HEADERS = (
    "NODE",
    "PASS",
    "REMOVED",
    "FREED",
    "HELD BACK (IN USE/PINNED/LIVE JOB/TOO YOUNG)",
    "ERROR",
)


def format_table(nodes: Sequence[str], results: dict[str, NodePruneResult]) -> str:
    """One row per node, columns aligned like kubectl's."""
    rows = [list(HEADERS)]
    for node in nodes:
        r = results[node]
        held = r.held_back
        rows.append(
            [
                node,
                r.pass_kind or "-",
                str(r.records_removed),
                human_bytes(r.bytes_freed),
                "/".join(
                    human_bytes(b)
                    for b in (held.in_use, held.pinned, held.live_job, held.too_young)
                ),
                r.error or "-",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS) - 1)]
    return "\n".join(
        "   ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in rows
    )


__all__ = ["clear_containerd", "format_table", "human_bytes", "register"]
