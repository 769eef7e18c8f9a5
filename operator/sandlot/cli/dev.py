"""``sandlot dev up|down``: a local control plane for trying sandlot on one
machine (``sandlot.devtools.dev``, imported only when the command runs);
``sandlot dev cluster up|down``: a local cluster with kubelet nodes
(``sandlot.devtools.cluster``)."""

from __future__ import annotations

import argparse
from typing import Any

from sandlot.cli.devimport import devtools

DEFAULT_DIR = ".dev"
CLUSTER_DIR = ".dev/cluster"


def register(sub: Any) -> None:
    dev = sub.add_parser("dev", help="a local control plane for trying sandlot")
    dev_sub = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = dev_sub.add_parser("up", help="start etcd + kube-apiserver and apply the CRDs")
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})")
    up.set_defaults(func=run)
    down = dev_sub.add_parser(
        "down", help="stop what `dev up`, `demo --keep` or `dev cluster up` started there"
    )
    down.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})"
    )
    down.set_defaults(func=run)
    cluster = dev_sub.add_parser(
        "cluster", help="a local cluster: control plane, scheduler and kubelet nodes"
    )
    cluster_sub = cluster.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    cluster_up = cluster_sub.add_parser(
        "up", help="start it with the pause and sandlot images imported (root)"
    )
    cluster_up.add_argument(
        "--dir", default=CLUSTER_DIR, help=f"state directory (default: {CLUSTER_DIR})"
    )
    cluster_up.add_argument("--nodes", type=int, default=2, help="kubelet nodes (default: 2)")
    cluster_up.set_defaults(func=run_cluster)
    cluster_down = cluster_sub.add_parser("down", help="stop what `dev cluster up` started")
    cluster_down.add_argument(
        "--dir", default=CLUSTER_DIR, help=f"state directory (default: {CLUSTER_DIR})"
    )
    cluster_down.set_defaults(func=run_cluster)


def run(args: argparse.Namespace) -> int:
    dev = devtools("dev", f"dev {args.action}")
    return int(dev.up(args.dir) if args.action == "up" else dev.down(args.dir))


def run_cluster(args: argparse.Namespace) -> int:
    commands = devtools("cluster.commands", f"dev cluster {args.cluster_action}")
    if args.cluster_action == "up":
        return int(commands.up(args.dir, args.nodes))
    return int(commands.down(args.dir))
