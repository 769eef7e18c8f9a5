"""``sandlot status``: the fleet on one screen.

Three tables from one read of the cluster (``sandlot.adapters.fleetview``):

- nodes: phase, live sandboxes against capacity, and the image collector's state
  (last pass and its age, bytes it freed, and how long automatic passes are
  held off by the exhausted backoff);
- sandboxes by phase on each node (unbound ones under ``<none>``);
- pools: desired and running members.

The sandbox counts come from the Sandboxes themselves, not from the nodes'
status, so a node whose agent is gone still shows what it was running. The
tables are built by pure functions of the objects and ``now``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sandlot.adapters.fleetview import read_fleet
from sandlot.adapters.kube import load_api_client
from sandlot.api.node import NodePhase
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.api.timestamps import parse_time

UNBOUND = "<none>"
PHASES = [p.value for p in SandboxPhase]


def register(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="print a fleet summary: nodes, sandboxes per node and phase, pools",
        description="Nodes (phase, sandboxes, capacity, image GC), sandboxes by phase "
        "on each node, and pools (desired, running).",
    )
    status.add_argument(
        "-n", "--namespace", default=None, help="sandboxes and pools of this namespace only"
    )
    status.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    status.set_defaults(func=run_status)


def run_status(args: argparse.Namespace) -> int:
    api = load_api_client(args.kubeconfig)
    try:
        fleet = read_fleet(api, args.namespace)
    finally:
        api.close()
    print(fleet_report(fleet.nodes, fleet.sandboxes, fleet.pools, datetime.now(UTC)))
    return 0


# -- pure formatting ---------------------------------------------------------------


def human_bytes(n: int | None) -> str:
    if not n:
        return "0"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover - the loop always returns


def human_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()
        for r in (header, *rows)
    ]
    return "\n".join(lines)


def _phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or SandboxPhase.PENDING.value)


def _node_of(sb: Mapping[str, Any]) -> str:
    return str((sb.get("spec") or {}).get("nodeName") or UNBOUND)


def node_rows(
    nodes: Sequence[Mapping[str, Any]], sandboxes: Sequence[Mapping[str, Any]], now: datetime
) -> list[list[str]]:
    live = Counter(_node_of(sb) for sb in sandboxes if _phase(sb) not in TERMINAL_PHASES)
    rows = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        status = node.get("status") or {}
        gc = status.get("gc") or {}
        last = "-"
        if gc.get("lastPassKind"):
            when = parse_time(gc.get("lastPassTime"))
            ago = f" {human_age((now - when).total_seconds())} ago" if when else ""
            last = f"{gc['lastPassKind']}{ago}"
        until = parse_time(gc.get("exhaustedUntil"))
        exhausted = (
            f"{until.strftime('%H:%M:%SZ')} (in {human_age((until - now).total_seconds())})"
            if until and until > now
            else "-"
        )
        capacity = (status.get("capacity") or {}).get("sandboxes")
        phase = status.get("phase") or "-"
        if (node.get("spec") or {}).get("unschedulable") and phase != NodePhase.DISABLED:
            phase += ",Unschedulable"
        rows.append(
            [
                name,
                phase,
                str(live.get(name, 0)),
                "-" if capacity is None else str(capacity),
                last,
                human_bytes(gc.get("bytesFreed")) if gc.get("lastPassKind") else "-",
                exhausted,
            ]
        )
    return rows


def sandbox_rows(sandboxes: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    by_node: dict[str, Counter[str]] = {}
    for sb in sandboxes:
        by_node.setdefault(_node_of(sb), Counter())[_phase(sb)] += 1
    order = sorted(by_node, key=lambda n: (n == UNBOUND, n))
    return [[node, *(str(by_node[node].get(p, 0)) for p in PHASES)] for node in order]


def pool_rows(pools: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for pool in sorted(
        pools, key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"])
    ):
        spec, status = pool.get("spec") or {}, pool.get("status") or {}
        rows.append(
            [
                pool["metadata"].get("namespace", ""),
                pool["metadata"]["name"],
                str(spec.get("replicas", 0)),
                str(status.get("running", 0)),
                str(status.get("pending", 0)),
                str(status.get("dead", 0)),
            ]
        )
    return rows


def fleet_report(
    nodes: Sequence[Mapping[str, Any]],
    sandboxes: Sequence[Mapping[str, Any]],
    pools: Sequence[Mapping[str, Any]],
    now: datetime,
) -> str:
    phases = Counter((n.get("status") or {}).get("phase") or "Unknown" for n in nodes)
    summary = ", ".join(f"{count} {phase}" for phase, count in sorted(phases.items()))
    parts = [f"NODES ({len(nodes)}{': ' + summary if summary else ''})"]
    header = ["NAME", "PHASE", "SANDBOXES", "CAPACITY", "LAST-GC", "FREED", "EXHAUSTED-UNTIL"]
    parts.append(table(header, node_rows(nodes, sandboxes, now)) if nodes else "(no nodes)")
    parts += ["", f"SANDBOXES BY NODE AND PHASE ({len(sandboxes)})"]
    rows = sandbox_rows(sandboxes)
    parts.append(table(["NODE", *(p.upper() for p in PHASES)], rows) if rows else "(none)")
    parts += ["", f"POOLS ({len(pools)})"]
    rows = pool_rows(pools)
    header = ["NAMESPACE", "NAME", "DESIRED", "RUNNING", "PENDING", "DEAD"]
    parts.append(table(header, rows) if rows else "(none)")
    return "\n".join(parts)
