"""The MCP server: ``SandboxTools``' methods registered as tools with the ``mcp``
package's ``MCPServer``, served over stdio.

The only translation here is ``ToolFailure`` into the package's ``ToolError``,
which the model receives as the tool's error text; any other exception is a bug
and reaches the model only as "Error executing tool", its traceback on stderr.
Tools are plain functions, which the package runs in worker threads, so a long
command does not hold up the other calls.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from sandlot.client import Client
from sandlot.mcpserver.tools import TOOLS, SandboxTools, ToolFailure

INSTRUCTIONS = (
    "Sandboxes on Kubernetes: isolated containers to run commands and keep files in. "
    "create_sandbox (an image) or claim_sandbox (a warm one from a pool) gives a sandbox's "
    "name; run_command, read_file, write_file and list_files act in it; terminate_sandbox "
    "releases it, which you should do when done. Each error says what to do next."
)

# How each tool touches the world, for clients that ask before a risky call.
ANNOTATIONS: dict[str, ToolAnnotations] = {
    "create_sandbox": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "claim_sandbox": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "run_command": ToolAnnotations(read_only_hint=False, destructive_hint=True),
    "read_file": ToolAnnotations(read_only_hint=True),
    "write_file": ToolAnnotations(read_only_hint=False, destructive_hint=True),
    "list_files": ToolAnnotations(read_only_hint=True),
    "terminate_sandbox": ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True
    ),
}


def as_tool(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with ``ToolFailure`` raised as ``ToolError``; its signature and
    docstring (the tool's schema and description) are kept."""

    @functools.wraps(method)
    def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except ToolFailure as e:
            raise ToolError(str(e)) from e

    return tool


def build_server(tools: SandboxTools) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(name="sandlot", instructions=INSTRUCTIONS)
    for name in TOOLS:
        method = getattr(tools, name)
        server.add_tool(
            as_tool(method),
            name=name,
            description=inspect.getdoc(method),
            annotations=ANNOTATIONS[name],
        )
    return server


def serve(kubeconfig: str | os.PathLike[str] | None, namespace: str | None) -> None:
    """Serve the tools on stdin/stdout until the client closes stdin; a ``namespace``
    confines every call to it, None leaves calls free to name any (default: default)."""
    with Client(kubeconfig, namespace or "default") as client:
        tools = SandboxTools(client, namespace or "default", confined=namespace is not None)
        build_server(tools).run("stdio")


__all__ = ["build_server", "serve"]
