"""``sandlot mcp`` as a model client runs it: a subprocess spoken to over stdio by the
``mcp`` package's own client, its tools acting through the real SDK, API server,
gateway, agent and containerd (the fixtures of ``tests/support/streams.py``).

No operator runs here, so the test does the scheduler's one write: it places the
sandbox ``create_sandbox`` made on the agent's node (spec.nodeName, status
Scheduled). Everything else (the wait for Running, exec, files, the delete) is the
tool's own doing through the SDK.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from kubernetes import client
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import TextContent

from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from sandlot.mcpserver.tools import TOOLS
from tests.support.streams import EDIT, IMAGE, _grant, _user_kubeconfig
from tests.support.wait import wait_for

# What a model's sandboxes need on top of sandlot-edit: making and releasing them.
MAKER = [
    *EDIT,
    {
        "apiGroups": [GROUP],
        "resources": ["sandboxes", "sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
]
# Each tool's arguments a model must know of.
ARGUMENTS = {
    "create_sandbox": {"image", "command", "namespace", "timeout"},
    "claim_sandbox": {"pool", "namespace", "timeout"},
    "run_command": {"sandbox", "command", "timeout", "stdin", "namespace"},
    "read_file": {"sandbox", "path", "namespace"},
    "write_file": {"sandbox", "path", "content", "encoding", "namespace"},
    "list_files": {"sandbox", "path", "limit", "namespace"},
    "terminate_sandbox": {"sandbox", "namespace"},
}
SESSION_TIMEOUT = 180  # seconds for one whole conversation with the server


@asynccontextmanager
async def mcp_session(
    kubeconfig: Path, namespace: str, errlog: TextIO
) -> AsyncIterator[ClientSession]:
    """An initialized session with ``sandlot mcp`` started as a subprocess."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sandlot.cli.main", "mcp", "--kubeconfig", str(kubeconfig), "-n", namespace],
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The tool's structured result; its error text fails the test."""
    result = await session.call_tool(tool, arguments)
    said = " ".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, f"{tool} failed: {said}"
    structured: dict[str, Any] | None = result.structured_content
    assert structured is not None, f"{tool} returned no structured result: {said}"
    return structured


def run_session(scenario: Any, errlog_path: Path) -> None:
    """``scenario(errlog)`` within ``SESSION_TIMEOUT``; the server's stderr on failure."""

    async def bounded() -> None:
        with errlog_path.open("w") as errlog, anyio.fail_after(SESSION_TIMEOUT):
            await scenario(errlog)

    try:
        anyio.run(bounded)
    except BaseException as e:
        log = errlog_path.read_text() if errlog_path.exists() else ""
        raise AssertionError(
            f"the MCP session failed ({e!r}); the server said:\n{log[-4000:]}"
        ) from e


def test_the_server_lists_every_tool_with_its_input_schema(tmp_path: Path) -> None:
    # Listing needs no cluster: a kubeconfig that names an unreachable server will do.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )

    async def scenario(errlog: TextIO) -> None:
        async with mcp_session(kubeconfig, "team-a", errlog) as session:
            listed = await session.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert sorted(tools) == sorted(TOOLS)
        for name, arguments in ARGUMENTS.items():
            schema = tools[name].input_schema
            assert schema["type"] == "object"
            assert set(schema["properties"]) == arguments, name
            assert tools[name].description, name
        assert schema_of(tools["run_command"].input_schema, "command") == {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
        }
        assert tools["run_command"].input_schema["required"] == ["sandbox", "command"]

    run_session(scenario, tmp_path / "server.log")


def schema_of(schema: dict[str, Any], argument: str) -> dict[str, Any]:
    return {
        k: v
        for k, v in schema["properties"][argument].items()
        if k in ("type", "items", "minItems")
    }


@pytest.fixture(scope="module")
def maker(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    places: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The kubeconfig of ``model``, a ServiceAccount that may make and use sandboxes in
    the tenant's namespace, and nothing else."""
    _, tenant = places
    path = _user_kubeconfig(kube, control_plane, tenant, "model", tmp_path_factory.mktemp("mcp"))
    _grant(kube, tenant, "model-sandboxes", MAKER, (tenant, "model"))
    return path


def schedule_the_new_sandbox(kube: client.ApiClient, namespace: str, node: str) -> str:
    """The scheduler's write, once a sandbox appears in ``namespace``: onto ``node``."""
    custom: Any = client.CustomObjectsApi(kube)

    def unplaced() -> str | None:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes")[
            "items"
        ]
        names = [i["metadata"]["name"] for i in items if not i["spec"].get("nodeName")]
        return names[0] if names else None

    name = wait_for(unplaced, timeout=30, what="create_sandbox to create a sandbox")
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name, {"spec": {"nodeName": node}}
    )
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", name, {"status": {"phase": "Scheduled"}}
    )
    return name


def sandbox_exists(kube: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", name
        )
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


@pytest.mark.containerd
@pytest.mark.integration
def test_a_model_client_creates_a_sandbox_runs_a_command_moves_a_file_and_terminates(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path, tmp_path: Path
) -> None:
    _, tenant = places

    async def scenario(errlog: TextIO) -> None:
        async with mcp_session(maker, tenant, errlog) as session:
            with ThreadPoolExecutor(1) as pool:
                placed = pool.submit(schedule_the_new_sandbox, kube, tenant, agent.node)
                made = await call(
                    session, "create_sandbox", image=IMAGE, command=["sleep", "1000"], timeout=60
                )
                assert made["sandbox"] == placed.result(timeout=5)
            name = made["sandbox"]
            assert made["namespace"] == tenant

            ran = await call(session, "run_command", sandbox=name, command=["echo", "hi"])
            assert (ran["stdout"], ran["stderr"], ran["exit_code"]) == ("hi\n", "", 0)
            fed = await call(session, "run_command", sandbox=name, command=["cat"], stdin="fed")
            assert fed["stdout"] == "fed"

            text = "written by a model\n"
            wrote = await call(
                session, "write_file", sandbox=name, path="/tmp/note.txt", content=text
            )
            assert wrote["size"] == len(text)
            read = await call(session, "read_file", sandbox=name, path="/tmp/note.txt")
            assert (read["content"], read["encoding"]) == (text, "utf-8")
            listed = await call(session, "list_files", sandbox=name, path="/tmp")
            assert "note.txt" in {entry["name"] for entry in listed["entries"]}

            missing = await session.call_tool("read_file", {"sandbox": name, "path": "/tmp/nope"})
            assert missing.is_error
            said = missing.content[0]
            assert isinstance(said, TextContent), said
            assert "FileError" in said.text
            assert "look with list_files" in said.text

            released = await call(session, "terminate_sandbox", sandbox=name)
            assert released["deleted"] == f"sandbox {name}"
        await anyio.to_thread.run_sync(
            lambda: wait_for(
                lambda: not sandbox_exists(kube, tenant, name),
                timeout=30,
                what="the terminated sandbox to be deleted",
            )
        )

    run_session(scenario, tmp_path / "server.log")
