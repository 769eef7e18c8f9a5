"""The ``sandlot`` command (also installed as ``kubectl-sandlot``).

Subcommands are registered by the modules that own them, and only the module of
the command being run is imported: ``sandlot agent`` on a node loads the agent
and its settings, never the operator's controllers or the development tools,
and ``sandlot operator`` never loads the agent. Only a bare ``sandlot`` or
``sandlot --help`` (which lists every command) imports them all. This module
parses arguments and turns the user's bad input (``UsageError``, settings
refused by their model included) into one clear line and exit code 2; any other
exception, a ``ValueError`` from deep inside included, keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from sandlot.api.errors import UsageError

# Command name -> the module whose ``register(sub)`` adds it.
COMMANDS: dict[str, str] = {
    "agent": "sandlot.cli.agent_cmd",
    "cache": "sandlot.cli.cache",
    "cp": "sandlot.cli.transfer",
    "demo": "sandlot.cli.demo",
    "dev": "sandlot.cli.dev",
    "gateway": "sandlot.cli.gateway_cmd",
    "gen": "sandlot.cli.gen",
    "drain": "sandlot.cli.nodes",
    "exec": "sandlot.cli.streams",
    "logs": "sandlot.cli.streams",
    "mcp": "sandlot.cli.mcp_cmd",
    "nodes": "sandlot.cli.nodes",
    "operator": "sandlot.cli.operator_cmd",
    "pool": "sandlot.cli.pools",
    "port-forward": "sandlot.cli.transfer",
    "purge": "sandlot.cli.purge",
    "router-url": "sandlot.cli.router",
    "status": "sandlot.cli.status",
    "uncordon": "sandlot.cli.nodes",
}


def command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the
    top-level options take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: only the named command's module is imported, or
    every module when ``argv`` names no known command (for the full help)."""
    parser = argparse.ArgumentParser(
        prog="sandlot",
        description="Sandboxes on Kubernetes that survive the fleet's failures.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = COMMANDS.get(command_in(sys.argv[1:] if argv is None else argv) or "")
    modules = [chosen] if chosen else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).register(sub)
    return parser


def split_trailing(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``argv`` before its first ``--``, and what follows it untouched (``sandlot exec
    SB -- CMD -x``); argparse's own ``--`` does not reach a subcommand's arguments."""
    words = list(argv)
    if "--" not in words:
        return words, None
    cut = words.index("--")
    return words[:cut], words[cut + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    words, trailing = split_trailing(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    args.trailing = trailing
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except UsageError as e:  # the user's input: one line; anything else keeps its traceback
        print(f"sandlot: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
