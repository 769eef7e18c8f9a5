"""``sandlot mcp``: a Model Context Protocol server on stdin/stdout whose tools
create, claim and use sandboxes as the kubeconfig's identity (``sandlot.mcpserver``).

An MCP client starts it as a subprocess; stdout carries the protocol alone, so
logs go to stderr.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "mcp",
        help="serve sandboxes to model clients (Model Context Protocol over stdio)",
        description="Serve MCP tools on stdin/stdout (create_sandbox, claim_sandbox, "
        "run_command, read_file, write_file, list_files, terminate_sandbox), acting as the "
        "kubeconfig's identity through the Python SDK. See docs/sdk.md.",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="the only namespace the tools act in: a call naming another is refused "
        "(default: calls may name any; those naming none use default)",
    )
    parser.set_defaults(func=run_mcp)


def run_mcp(args: argparse.Namespace) -> int:
    from sandlot.api.errors import UsageError
    from sandlot.client import SandlotError
    from sandlot.mcpserver.server import serve

    try:
        serve(args.kubeconfig, args.namespace)
    except SandlotError as e:  # the kubeconfig cannot be loaded: its message says why
        raise UsageError(str(e)) from None
    return 0
