"""The ``sandlot`` command (also installed as ``kubectl-sandlot``).

Subcommands are registered by the modules that own them; this module only
parses arguments and turns known errors into one clear line and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sandlot.cli import agent_cmd, cache, demo, dev, gen, nodes, operator_cmd, purge, status


class UsageError(Exception):
    """Bad input from the command line or environment; printed as one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandlot",
        description="Sandboxes on Kubernetes that survive the fleet's failures.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    agent_cmd.register(sub)
    cache.register(sub)
    demo.register(sub)
    dev.register(sub)
    gen.register(sub)
    nodes.register(sub)
    operator_cmd.register(sub)
    purge.register(sub)
    status.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError) as e:
        print(f"sandlot: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
