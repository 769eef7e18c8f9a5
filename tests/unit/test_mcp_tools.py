"""``sandlot mcp``'s tools without a cluster: how tool arguments become SDK calls and
how the SDK's results and errors become what a model reads, against a fake of the
project's own boundary, ``sandlot.client.Client``. The same tools through the real
SDK, the API server, the gateway, the agent and containerd, over stdio:
tests/integration/test_mcp_server.py."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import TextContent

from sandlot.api.keys import CLAIM_LABEL
from sandlot.client import (
    Channel,
    CommandError,
    FileError,
    FileInfo,
    Forbidden,
    SandboxGone,
    SandboxNotFound,
    SandlotError,
    TimedOut,
)
from sandlot.mcpserver.server import build_server
from sandlot.mcpserver.tools import (
    OUTPUT_CAP,
    TOOLS,
    SandboxTools,
    ToolFailure,
    as_text,
)

MiB = 1 << 20


class FakeExecution:
    """``Execution``: its frames, then its exit code or an error."""

    def __init__(
        self, frames: list[tuple[Channel, bytes]], exit_code: int = 0, then: Exception | None = None
    ) -> None:
        self.frames = frames
        self.final = exit_code
        self.then = then
        self.exit_code: int | None = None
        self.closed = False

    def __iter__(self) -> Iterator[tuple[Channel, bytes]]:
        yield from self.frames
        if self.then is not None:
            raise self.then
        self.exit_code = self.final

    def __enter__(self) -> FakeExecution:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True


class FakeFiles:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.listing: list[FileInfo] = []
        self.error: SandlotError | None = None

    def _check(self, path: str) -> None:
        if self.error is not None:
            raise self.error

    def read(self, path: str, *, timeout: float) -> bytes:
        self._check(path)
        if path not in self.data:
            raise FileError(path, 404, f"{path}: no such file or directory")
        return self.data[path]

    def write(self, path: str, data: bytes, *, timeout: float) -> None:
        self._check(path)
        self.data[path] = data

    def list(self, path: str, *, timeout: float) -> list[FileInfo]:
        self._check(path)
        return self.listing


class FakeSandbox:
    def __init__(
        self,
        name: str,
        namespace: str,
        claim: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.claim = claim
        self.body: dict[str, Any] = {"metadata": {"name": name, "labels": labels or {}}}
        self.files = FakeFiles()
        self.execution = FakeExecution([])
        self.stream_error: Exception | None = None
        self.streamed: list[dict[str, Any]] = []
        self.terminated = 0

    def stream(self, command: list[str], *, timeout: float, stdin: str | None) -> FakeExecution:
        self.streamed.append({"command": command, "timeout": timeout, "stdin": stdin})
        if self.stream_error is not None:
            raise self.stream_error
        return self.execution

    def terminate(self) -> None:
        self.terminated += 1


class FakeClient:
    """``Client``: the sandboxes it knows, and the error its next create/claim raises."""

    def __init__(self) -> None:
        self.sandboxes: dict[tuple[str, str], FakeSandbox] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.error: SandlotError | None = None

    def add(self, sandbox: FakeSandbox) -> FakeSandbox:
        self.sandboxes[(sandbox.namespace, sandbox.name)] = sandbox
        return sandbox

    def get(self, name: str, *, namespace: str) -> FakeSandbox:
        self.calls.append(("get", {"name": name, "namespace": namespace}))
        if isinstance(self.error, Forbidden):
            raise self.error
        if (namespace, name) not in self.sandboxes:
            raise SandboxNotFound(namespace, name)
        return self.sandboxes[(namespace, name)]

    def create(
        self, image: str, command: list[str] | None, *, namespace: str, timeout: float
    ) -> FakeSandbox:
        self.calls.append(
            (
                "create",
                {"image": image, "command": command, "namespace": namespace, "timeout": timeout},
            )
        )
        if self.error is not None:
            raise self.error
        return self.add(FakeSandbox("sandbox-abcde", namespace))

    def claim(self, pool: str, *, namespace: str, timeout: float) -> FakeSandbox:
        self.calls.append(("claim", {"pool": pool, "namespace": namespace, "timeout": timeout}))
        if self.error is not None:
            raise self.error
        return self.add(FakeSandbox(f"{pool}-x1", namespace, claim=f"{pool}-c1"))


@pytest.fixture
def sdk() -> FakeClient:
    return FakeClient()


@pytest.fixture
def tools(sdk: FakeClient) -> SandboxTools:
    return SandboxTools(sdk, "team-a")  # type: ignore[arg-type]


@pytest.fixture
def sb(sdk: FakeClient) -> FakeSandbox:
    return sdk.add(FakeSandbox("sb1", "team-a"))


# -- making and releasing ------------------------------------------------------------


def test_create_passes_image_command_and_timeout_in_the_default_namespace(
    tools: SandboxTools, sdk: FakeClient
) -> None:
    ref = tools.create_sandbox("busybox", ["sleep", "infinity"], timeout=30)
    assert (ref.sandbox, ref.namespace, ref.claim) == ("sandbox-abcde", "team-a", None)
    assert sdk.calls == [
        (
            "create",
            {
                "image": "busybox",
                "command": ["sleep", "infinity"],
                "namespace": "team-a",
                "timeout": 30,
            },
        )
    ]


def test_a_call_naming_a_namespace_acts_there(tools: SandboxTools, sdk: FakeClient) -> None:
    assert tools.create_sandbox("busybox", namespace="team-b").namespace == "team-b"
    assert sdk.calls[0][1]["namespace"] == "team-b"


CONFINED_CALLS: dict[str, Callable[[SandboxTools, str | None], object]] = {
    "create_sandbox": lambda t, ns: t.create_sandbox("busybox", namespace=ns),
    "claim_sandbox": lambda t, ns: t.claim_sandbox("python", namespace=ns),
    "run_command": lambda t, ns: t.run_command("sb1", ["true"], namespace=ns),
    "read_file": lambda t, ns: t.read_file("sb1", "/f", namespace=ns),
    "write_file": lambda t, ns: t.write_file("sb1", "/f", "x", namespace=ns),
    "list_files": lambda t, ns: t.list_files("sb1", "/", namespace=ns),
    "terminate_sandbox": lambda t, ns: t.terminate_sandbox("sb1", namespace=ns),
}


@pytest.mark.parametrize("tool", TOOLS, ids=TOOLS)
def test_a_confined_server_refuses_a_call_naming_another_namespace(
    sdk: FakeClient, tool: str
) -> None:
    theirs = sdk.add(FakeSandbox("sb1", "team-b"))
    confined = SandboxTools(sdk, "team-a", confined=True)  # type: ignore[arg-type]
    with pytest.raises(ToolFailure) as refused:
        CONFINED_CALLS[tool](confined, "team-b")
    text = str(refused.value)
    assert '"team-a"' in text and '"team-b"' in text, text
    assert sdk.calls == []  # nothing reached the API server
    assert theirs.terminated == 0 and theirs.streamed == []


@pytest.mark.parametrize("named", [None, "team-a"], ids=["naming_none", "naming_its_own"])
@pytest.mark.parametrize("tool", TOOLS, ids=TOOLS)
def test_a_confined_server_acts_in_its_own_namespace(
    sdk: FakeClient, tool: str, named: str | None
) -> None:
    sdk.add(FakeSandbox("sb1", "team-a"))
    sdk.sandboxes[("team-a", "sb1")].files.data["/f"] = b"x"
    confined = SandboxTools(sdk, "team-a", confined=True)  # type: ignore[arg-type]
    CONFINED_CALLS[tool](confined, named)
    assert [call["namespace"] for _, call in sdk.calls] == ["team-a"]


def test_claim_returns_the_sandbox_and_its_claim(tools: SandboxTools, sdk: FakeClient) -> None:
    ref = tools.claim_sandbox("python", timeout=5)
    assert (ref.sandbox, ref.claim) == ("python-x1", "python-c1")
    assert sdk.calls == [("claim", {"pool": "python", "namespace": "team-a", "timeout": 5})]


@pytest.mark.parametrize(
    ("tool", "says"),
    [("create_sandbox", "Nothing was left behind"), ("claim_sandbox", "no free member")],
    ids=["create", "claim"],
)
def test_a_wait_that_timed_out_says_what_was_released_and_to_retry(
    tools: SandboxTools, sdk: FakeClient, tool: str, says: str
) -> None:
    sdk.error = TimedOut("sandbox team-a/x was not ready within 30s; last seen: phase Pending")
    with pytest.raises(ToolFailure) as failed:
        getattr(tools, tool)("python")
    text = str(failed.value)
    assert text.startswith("TimedOut: sandbox team-a/x was not ready within 30s")
    assert says in text and "longer timeout" in text


@pytest.mark.parametrize(
    ("claim", "labels", "deleted"),
    [
        (None, {}, "sandbox sb1"),
        (None, {CLAIM_LABEL: "python-c9"}, "sandboxclaim python-c9"),
    ],
    ids=["made_deletes_the_sandbox", "claimed_deletes_its_claim"],
)
def test_terminate_releases_the_claim_when_the_sandbox_was_claimed(
    tools: SandboxTools,
    sdk: FakeClient,
    claim: str | None,
    labels: dict[str, str],
    deleted: str,
) -> None:
    released = sdk.add(FakeSandbox("sb1", "team-a", claim, labels))
    assert tools.terminate_sandbox("sb1").deleted == deleted
    assert released.terminated == 1
    assert released.claim == (labels.get(CLAIM_LABEL))


# -- commands ------------------------------------------------------------------------


def test_run_returns_stdout_stderr_and_exit_code_and_passes_stdin(
    tools: SandboxTools, sb: FakeSandbox
) -> None:
    sb.execution = FakeExecution(
        [(Channel.STDOUT, b"hi\n"), (Channel.STDERR, b"warn\n"), (Channel.STDOUT, b"there\n")],
        exit_code=3,
    )
    out = tools.run_command("sb1", ["sh", "-c", "x"], timeout=9, stdin="fed")
    assert (out.stdout, out.stderr, out.exit_code, out.note) == ("hi\nthere\n", "warn\n", 3, None)
    assert sb.streamed == [{"command": ["sh", "-c", "x"], "timeout": 9, "stdin": "fed"}]
    assert sb.execution.closed


def test_output_past_the_cap_is_cut_counted_and_noted(tools: SandboxTools, sb: FakeSandbox) -> None:
    chunk = b"a" * (600 * 1024)
    sb.execution = FakeExecution([(Channel.STDOUT, chunk)] * 3 + [(Channel.STDERR, b"e")])
    out = tools.run_command("sb1", ["yes"])
    assert len(out.stdout) == OUTPUT_CAP == MiB
    assert out.stderr == "e"
    assert out.note is not None
    assert f"stdout was cut to its first {MiB} of {3 * len(chunk)} bytes" in out.note
    assert "stderr" not in out.note


def test_a_command_past_its_timeout_fails_with_the_end_of_its_output(
    tools: SandboxTools, sb: FakeSandbox
) -> None:
    sb.execution = FakeExecution(
        [(Channel.STDOUT, b"partial\n")],
        then=TimedOut("'sleep' in sandbox team-a/sb1 ran past its 2s timeout and was ended"),
    )
    with pytest.raises(ToolFailure) as failed:
        tools.run_command("sb1", ["sleep", "30"], timeout=2)
    text = str(failed.value)
    assert "ran past its 2s timeout and was ended" in text
    assert "longer timeout" in text and "nohup" in text
    assert "'partial\\n'" in text


@pytest.mark.parametrize(
    ("where", "error", "says"),
    [
        ("missing", None, ['SandboxNotFound: sandbox "nope" not found', "Check the name"]),
        (
            "get",
            Forbidden("sandboxes is forbidden: cannot get"),
            ["Forbidden:", "retrying will not"],
        ),
        (
            "stream",
            CommandError("'nosuch' in sandbox team-a/sb1: exec: no such file"),
            ["CommandError:", "exists in the image"],
        ),
        (
            "iterate",
            SandboxGone("sb1", "Dead", "NodeLost", "its node stopped answering"),
            ['SandboxGone: sandbox "sb1" is Dead (NodeLost)', "create_sandbox or claim_sandbox"],
        ),
        ("stream", ValueError("a command needs at least one word"), ["Invalid arguments:"]),
    ],
    ids=["not_found", "forbidden", "no_such_program", "sandbox_gone", "sdk_refused_argument"],
)
def test_sdk_errors_of_a_command_say_what_happened_and_what_to_do(
    tools: SandboxTools,
    sdk: FakeClient,
    sb: FakeSandbox,
    where: str,
    error: Exception | None,
    says: list[str],
) -> None:
    name = "nope" if where == "missing" else "sb1"
    if where == "get":
        sdk.error = error  # type: ignore[assignment]
    elif where == "stream":
        sb.stream_error = error
    elif where == "iterate":
        sb.execution = FakeExecution([], then=error)
    with pytest.raises(ToolFailure) as failed:
        tools.run_command(name, ["true"])
    for part in says:
        assert part in str(failed.value)


# -- files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "content", "encoding"),
    [
        (b"hello\n", "hello\n", "utf-8"),
        ("héllo".encode(), "héllo", "utf-8"),
        (b"\x89PNG\x00\xff", base64.b64encode(b"\x89PNG\x00\xff").decode(), "base64"),
    ],
    ids=["text", "utf8_text", "binary_as_base64"],
)
def test_read_gives_text_as_it_is_and_anything_else_in_base64(
    tools: SandboxTools, sb: FakeSandbox, data: bytes, content: str, encoding: str
) -> None:
    sb.files.data["/f"] = data
    got = tools.read_file("sb1", "/f")
    assert (got.content, got.encoding, got.size, got.note) == (content, encoding, len(data), None)


def test_a_file_past_the_cap_is_cut_to_whole_characters_with_a_note(
    tools: SandboxTools, sb: FakeSandbox
) -> None:
    data = b"a" * (MiB - 1) + "é".encode() + b"rest"  # the cut falls inside the é
    sb.files.data["/big"] = data
    got = tools.read_file("sb1", "/big")
    assert (got.encoding, len(got.content), got.size) == ("utf-8", MiB - 1, len(data))
    assert got.note is not None and f"first {MiB} of {len(data)} bytes" in got.note


def test_text_cut_inside_a_character_stays_text() -> None:
    assert as_text("añ".encode()[:2]) == ("a", "utf-8")
    assert as_text(b"\xff\xfe\xfd\xfc\xfb")[1] == "base64"


@pytest.mark.parametrize(
    ("content", "encoding", "stored"),
    [("print(1)\n", "utf-8", b"print(1)\n"), ("AAEC", "base64", b"\x00\x01\x02")],
    ids=["text", "base64"],
)
def test_write_stores_the_decoded_bytes(
    tools: SandboxTools, sb: FakeSandbox, content: str, encoding: Any, stored: bytes
) -> None:
    assert tools.write_file("sb1", "/tmp/x", content, encoding).size == len(stored)
    assert sb.files.data["/tmp/x"] == stored


def test_write_of_bad_base64_is_refused_before_anything_is_sent(
    tools: SandboxTools, sb: FakeSandbox
) -> None:
    with pytest.raises(ToolFailure, match="not base64"):
        tools.write_file("sb1", "/tmp/x", "not base64!", "base64")
    assert sb.files.data == {}


@pytest.mark.parametrize(
    ("status", "advice"),
    [(404, "look with list_files"), (403, "sandbox's user owns"), (413, "smaller parts")],
    ids=["missing", "outside_root", "over_cap"],
)
def test_file_refusals_say_what_to_do_by_their_status(
    tools: SandboxTools, sb: FakeSandbox, status: int, advice: str
) -> None:
    sb.files.error = FileError("/etc/x", status, "refused")
    with pytest.raises(ToolFailure) as failed:
        tools.read_file("sb1", "/etc/x")
    assert str(failed.value).startswith("FileError: /etc/x: refused.")
    assert advice in str(failed.value)


def test_list_is_sorted_bounded_and_says_how_many_there_were(
    tools: SandboxTools, sb: FakeSandbox
) -> None:
    sb.files.listing = [FileInfo(f"f{i:02}", "file", i, 0o644, 1700000000) for i in (3, 1, 2, 0)]
    listing = tools.list_files("sb1", "/work", limit=3)
    assert [e.name for e in listing.entries] == ["f00", "f01", "f02"]
    assert (listing.total, listing.entries[0].mode) == (4, "0644")
    assert listing.note is not None and "first 3 of 4" in listing.note


# -- through the MCP server ----------------------------------------------------------


def test_the_server_offers_every_tool_and_turns_failures_into_tool_errors(
    tools: SandboxTools, sb: FakeSandbox
) -> None:
    from mcp import Client as McpClient

    sb.execution = FakeExecution([(Channel.STDOUT, b"hi\n")])
    server = build_server(tools)

    async def session() -> None:
        with anyio.fail_after(30):
            async with McpClient(server) as mcp:
                listed = await mcp.list_tools()
                assert sorted(t.name for t in listed.tools) == sorted(TOOLS)
                ran = await mcp.call_tool("run_command", {"sandbox": "sb1", "command": ["echo"]})
                assert not ran.is_error
                assert ran.structured_content == {
                    "exit_code": 0,
                    "stdout": "hi\n",
                    "stderr": "",
                    "note": None,
                }
                missing = await mcp.call_tool("read_file", {"sandbox": "nope", "path": "/x"})
                assert missing.is_error
                said = missing.content[0]
                assert isinstance(said, TextContent), said
                text = said.text
                assert 'SandboxNotFound: sandbox "nope" not found in namespace team-a.' in text
                assert "Check the name and the namespace" in text

    anyio.run(session)


# -- the command ---------------------------------------------------------------------


def test_sandlot_mcp_loads_neither_kopf_nor_grpc_nor_the_programs() -> None:
    probe = (
        "import json, sys, sandlot.cli.mcp_cmd, sandlot.mcpserver.server\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kopf', 'grpc', 'sandlot'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "sandlot.mcpserver.tools" in loaded  # the probe really imported the server
    heavy = [
        m
        for m in loaded
        if m.split(".")[0] in ("kopf", "grpc")
        or m.startswith(("sandlot.controllers", "sandlot.agent", "sandlot.gateway"))
        or m.startswith(("sandlot.adapters.containerd", "sandlot.devtools"))
    ]
    assert heavy == []


def test_an_unloadable_kubeconfig_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", "mcp", "--kubeconfig", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("sandlot: error: cannot load Kubernetes configuration")
    assert proc.stdout == ""  # stdout is the protocol's alone
