"""sandlot's Python SDK: sandboxes for programs.

    from sandlot.client import Client

    with Client(namespace="team-a").claim("python", timeout=30) as sb:
        print(sb.run(["python3", "-c", "print(6 * 7)"]).stdout)

It talks to the API server alone, with the kubeconfig's (or the pod's) identity,
exactly as ``sandlot exec`` and ``sandlot cp`` do, and loads neither the operator
nor the agent (no kopf, no gRPC). See ``docs/sdk.md``.
"""

from sandlot.client.aio import AsyncClient, AsyncFiles, AsyncSandbox
from sandlot.client.client import Client
from sandlot.client.commands import Channel, Execution, Result
from sandlot.client.errors import (
    CommandError,
    FileError,
    Forbidden,
    SandboxGone,
    SandboxNotFound,
    SandlotError,
    TimedOut,
)
from sandlot.client.files import FileInfo, Files
from sandlot.client.sandbox import Sandbox
from sandlot.client.snapshots import Snapshot
from sandlot.client.tunnel import Tunnel

__all__ = [
    "AsyncClient",
    "AsyncFiles",
    "AsyncSandbox",
    "Channel",
    "Client",
    "CommandError",
    "Execution",
    "FileError",
    "FileInfo",
    "Files",
    "Forbidden",
    "Result",
    "Sandbox",
    "SandboxGone",
    "SandboxNotFound",
    "SandlotError",
    "Snapshot",
    "TimedOut",
    "Tunnel",
]
