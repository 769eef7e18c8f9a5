"""``sandlot dev up|down``: a local control plane for trying sandlot on one
machine (``sandlot.devtools.dev``, imported only when the command runs)."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_DIR = ".dev"


def register(sub: Any) -> None:
    dev = sub.add_parser("dev", help="a local control plane for trying sandlot")
    dev_sub = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = dev_sub.add_parser("up", help="start etcd + kube-apiserver and apply the CRDs")
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})")
    up.set_defaults(func=run)
    down = dev_sub.add_parser("down", help="stop what `dev up` started")
    down.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})"
    )
    down.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sandlot.devtools import dev

    return dev.up(args.dir) if args.action == "up" else dev.down(args.dir)
