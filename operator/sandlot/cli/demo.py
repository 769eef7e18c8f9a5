"""``sandlot demo``: the whole story on one machine, in about a minute (the
scenario is ``sandlot.devtools.demo``, imported only when the command runs)."""

from __future__ import annotations

import argparse
from typing import Any

from sandlot.cli.devimport import devtools


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the whole story on one machine (needs root)")
    demo.add_argument("--dir", default=".dev/demo", help="state directory [default .dev/demo]")
    demo.add_argument("--keep", action="store_true", help="leave everything running at the end")
    demo.add_argument(
        "--timeout", type=float, default=120.0, help="deadline of each step, seconds [120]"
    )
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    demo = devtools("demo", "demo")
    return int(demo.run_demo(args.dir, args.timeout, args.keep))
