"""The SDK's own decisions, without a cluster: what it loads, how env/cwd become a
command, how a stream's status and a sandbox's status read, and how ``claim`` waits
and releases (against a fake of its one boundary, ``adapters.sandboxapi.SandboxApi``).
The streams themselves are tested end to end in tests/integration/test_client_sdk.py."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import sandlot.client
from sandlot.adapters.sandboxapi import ApiRefused
from sandlot.adapters.streamclient import StreamRefused
from sandlot.api.common import CLAIMS, SANDBOXES
from sandlot.client import (
    Client,
    CommandError,
    Forbidden,
    SandboxGone,
    SandboxNotFound,
    SandlotError,
    Snapshot,
    TimedOut,
)
from sandlot.client.commands import (
    SHELL,
    Execution,
    Result,
    collect,
    command_argv,
    read_status,
)
from sandlot.client.sandbox import Sandbox, gone_from, refusal
from sandlot.policy.streams import STATUS, STDOUT, encode_frame, error_status, exit_status


def test_importing_the_sdk_loads_neither_kopf_nor_grpc_nor_the_programs() -> None:
    probe = (
        "import json, sys, sandlot.client\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kopf', 'grpc', 'sandlot'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "sandlot.client.client" in loaded  # the probe really imported the SDK
    heavy = [
        m
        for m in loaded
        if m.split(".")[0] in ("kopf", "grpc")
        or m.startswith(("sandlot.controllers", "sandlot.agent", "sandlot.gateway"))
        or m.startswith(("sandlot.adapters.containerd", "sandlot.devtools"))
    ]
    assert heavy == []


@pytest.mark.parametrize(
    ("command", "env", "cwd", "argv", "shell"),
    [
        (["ls", "-l"], None, None, ("ls", "-l"), False),
        ("echo $HOME", None, None, (SHELL, "-c", "echo $HOME"), True),
        (
            ["printenv", "A"],
            {"A": "x y'z"},
            None,
            (SHELL, "-c", "export A='x y'\"'\"'z'\nexec printenv A"),
            True,
        ),
        (["pwd"], None, "/tmp/a b", (SHELL, "-c", "cd '/tmp/a b' || exit 1\nexec pwd"), True),
    ],
    ids=["list_as_is", "string_through_sh", "env_quoted", "cwd_quoted"],
)
def test_env_and_cwd_travel_through_sh_quoted(
    command: Any, env: Any, cwd: Any, argv: tuple[str, ...], shell: bool
) -> None:
    assert command_argv(command, env, cwd) == (argv, shell)


@pytest.mark.parametrize(
    ("env", "cwd"),
    [({"A;rm": "x"}, None), (None, "relative/dir"), (None, None)],
    ids=["bad_env_name", "relative_cwd", "empty_command"],
)
def test_a_command_that_cannot_be_said_safely_is_refused(env: Any, cwd: Any) -> None:
    with pytest.raises(ValueError):
        command_argv([] if env is None and cwd is None else ["true"], env, cwd)


@pytest.mark.parametrize(
    ("status", "exit_code", "code"),
    [
        (exit_status(0), 0, 0),
        (exit_status(3), 3, 0),
        (error_status("x: no such file or directory", 404), None, 404),
        (error_status("outside the sandbox's root", 403), None, 403),
        (None, None, 0),
    ],
    ids=["success", "exit_code", "file_404", "file_403", "cut"],
)
def test_a_status_reads_as_an_exit_code_or_a_failure_with_its_code(
    status: bytes | None, exit_code: int | None, code: int
) -> None:
    outcome = read_status(status)
    assert (outcome.exit_code, outcome.code) == (exit_code, code)


@pytest.mark.parametrize(
    ("body", "phase"),
    [
        (None, None),
        ({"status": {"phase": "Dead", "reason": "NodeLost", "message": "lease expired"}}, "Dead"),
        ({"status": {"phase": "Stopped", "reason": "DeadlineExceeded"}}, "Stopped"),
    ],
    ids=["deleted", "dead", "stopped"],
)
def test_an_ended_sandbox_says_which_and_why(body: Any, phase: str | None) -> None:
    gone = gone_from("sb", body)
    assert gone is not None and gone.phase == phase
    if body:
        assert body["status"]["reason"] in str(gone)


def test_a_running_sandbox_is_not_gone() -> None:
    assert gone_from("sb", {"metadata": {}, "status": {"phase": "Running"}}) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [(403, Forbidden), (401, Forbidden), (404, SandboxNotFound), (500, SandlotError)],
    ids=["forbidden", "unauthorized", "not_found", "other"],
)
def test_api_refusals_map_to_typed_errors(status: int, kind: type[SandlotError]) -> None:
    assert type(refusal(ApiRefused(status, "no"), "ns", "sb")) is kind


class FakeApi:
    """``SandboxApi`` at its boundary: objects in a dict; ``wait`` answers from the
    states a test queues for each name (a watch's successive events)."""

    def __init__(self, events: dict[str, list[dict[str, Any] | None]]) -> None:
        self.events = events
        self.deleted: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []

    def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body)
        return {**body, "metadata": {"name": "c1", "namespace": namespace}}

    def wait(
        self,
        plural: str,
        namespace: str,
        name: str,
        done: Callable[[dict[str, Any] | None], bool],
        deadline: float,
    ) -> dict[str, Any] | None:
        for body in self.events.get(name, []):
            if done(body):
                return body
        raise TimeoutError

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.deleted.append((plural, name))

    def close(self) -> None:
        pass


def sandbox(phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "sb1", "namespace": "ns"}, "status": {"phase": phase}}


def claim(phase: str, message: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": "c1"},
        "status": {"phase": phase, "sandboxName": "sb1", "message": message},
    }


def client_with(api: FakeApi) -> Client:
    made = Client.__new__(Client)
    made._api = api  # type: ignore[assignment]
    made.namespace = "ns"
    return made


def test_claim_returns_the_bound_sandbox_once_running_and_terminate_deletes_the_claim() -> None:
    api = FakeApi({"c1": [claim("Pending"), claim("Bound")], "sb1": [sandbox("Running")]})
    sb = client_with(api).claim("warm")
    assert (sb.name, sb.claim, sb.phase) == ("sb1", "c1", "Running")
    assert api.deleted == []
    with sb:
        pass
    assert api.deleted == [(CLAIMS, "c1")]


@pytest.mark.parametrize(
    ("events", "error"),
    [
        ({"c1": [claim("Pending")]}, TimedOut),
        ({"c1": [claim("Lost", "its sandbox was deleted")]}, SandboxGone),
        ({"c1": [claim("Bound")], "sb1": [sandbox("Dead")]}, SandboxGone),
    ],
    ids=["never_bound", "lost", "bound_sandbox_dead"],
)
def test_a_claim_that_does_not_come_through_is_released(
    events: dict[str, list[dict[str, Any] | None]], error: type[SandlotError]
) -> None:
    api = FakeApi(events)
    with pytest.raises(error):
        client_with(api).claim("warm", timeout=1)
    assert api.deleted == [(CLAIMS, "c1")]


def test_create_that_times_out_deletes_its_sandbox() -> None:
    api = FakeApi({"c1": [sandbox("Pending")]})
    with pytest.raises(TimedOut, match="phase Pending"):
        client_with(api).create("busybox", timeout=1)
    assert api.deleted == [(SANDBOXES, "c1")]


class FakeStream:
    """``adapters.streamclient.Stream`` at its boundary: the messages an agent sent."""

    def __init__(self, messages: list[bytes]) -> None:
        self.messages = list(messages)
        self.closed = False

    def recv(self, timeout: float | None = None) -> bytes | None:
        return self.messages.pop(0) if self.messages else None

    def send(self, message: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


DEAD = SandboxGone("sb", "Dead", "NodeLost", "its node stopped renewing its lease")


@pytest.mark.parametrize(
    ("status", "gone", "shell", "expect"),
    [
        (exit_status(0), None, False, 0),
        (exit_status(137), None, False, 137),
        (exit_status(137), DEAD, False, SandboxGone),
        (exit_status(1), DEAD, False, 1),
        (None, DEAD, False, SandboxGone),
        (None, None, False, CommandError),
        (error_status("cannot run '/bin/sh': no such file"), None, True, "an image with a shell"),
        (error_status("cannot run 'nope': no such file"), None, False, "cannot run 'nope'"),
    ],
    ids=[
        "success",
        "killed_while_the_sandbox_runs",
        "killed_because_the_sandbox_died",
        "ordinary_failure_is_not_looked_into",
        "cut_by_the_sandbox_dying",
        "cut_while_the_sandbox_runs",
        "env_cwd_without_a_shell",
        "no_such_program",
    ],
)
def test_how_a_command_ended_is_told_from_its_status_and_the_sandboxs(
    status: bytes | None, gone: SandboxGone | None, shell: bool, expect: Any
) -> None:
    messages = [encode_frame(STDOUT, b"out")] + ([encode_frame(STATUS, status)] if status else [])
    stream = FakeStream(messages)
    execution = Execution(
        stream,  # type: ignore[arg-type]
        describe="cmd",
        through_shell=shell,
        deadline=None,
        timeout=None,
        gone=lambda: gone,
    )
    if isinstance(expect, int):
        assert collect(execution) == Result(b"out", b"", expect)
    elif isinstance(expect, str):
        with pytest.raises(CommandError, match=expect):
            collect(execution)
    else:
        with pytest.raises(expect):
            collect(execution)
    assert stream.closed


def test_the_docs_example_compiles_and_imports_what_the_sdk_has() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "sdk.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/sdk.md has no python example"
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "sandlot.client":
                missing = [a.name for a in node.names if not hasattr(sandlot.client, a.name)]
                assert missing == [], f"docs/sdk.md imports what sandlot.client lacks: {missing}"


class FlakyGatewayApi(FakeApi):
    """The gateway answers 502 to the first stream it is asked for."""

    def __init__(self) -> None:
        super().__init__({})
        self.opened: list[str] = []

    def open_stream(self, path: str) -> FakeStream:
        self.opened.append(path)
        if len(self.opened) == 1:
            raise StreamRefused(502, "the agent failed the upgrade")
        return FakeStream([encode_frame(STDOUT, b"data"), encode_frame(STATUS, exit_status(0))])

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return sandbox("Running")


def test_a_file_stream_the_gateway_could_not_open_is_opened_once_more_a_command_is_not() -> None:
    api = FlakyGatewayApi()
    sb = Sandbox(api, sandbox("Running"))  # type: ignore[arg-type]
    assert sb.files.read("/etc/hostname") == b"data"
    assert len(api.opened) == 2

    api = FlakyGatewayApi()
    sb = Sandbox(api, sandbox("Running"))  # type: ignore[arg-type]
    with pytest.raises(CommandError, match="502"):
        sb.run(["true"])
    assert len(api.opened) == 1


def test_a_kubeconfig_that_cannot_be_loaded_is_a_sandlot_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.kubeconfig"
    with pytest.raises(SandlotError, match=re.escape(str(missing))):
        Client(missing)


def test_lifecycle_arguments_become_the_specs_fields() -> None:
    at = datetime(2030, 1, 2, 16, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    api = FakeApi({"c1": [claim("Bound"), sandbox("Running")], "sb1": [sandbox("Running")]})
    client_with(api).claim(
        "warm", shutdown_time=at, shutdown_policy="Delete", ttl_seconds_after_finished=30
    )
    assert api.created[0]["spec"] == {
        "poolName": "warm",
        "lifecycle": {
            "shutdownTime": "2030-01-02T15:04:05Z",
            "shutdownPolicy": "Delete",
            "ttlSecondsAfterFinished": 30,
        },
    }
    client_with(api).create("busybox", ttl_seconds_after_finished=0)
    assert api.created[1]["spec"] == {"image": "busybox", "ttlSecondsAfterFinished": 0}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"shutdown_time": datetime(2030, 1, 1)}, "shutdown_time"),
        ({"shutdown_policy": "Sometimes"}, "shutdown_policy"),
        ({"ttl_seconds_after_finished": -1}, "ttl_seconds_after_finished"),
    ],
    ids=["naive_time", "unknown_policy", "negative_ttl"],
)
def test_bad_lifecycle_arguments_are_refused_naming_them(
    options: dict[str, Any], named: str
) -> None:
    api = FakeApi({})
    with pytest.raises(ValueError, match=named):
        client_with(api).claim("warm", **options)
    assert api.created == [], "nothing created"


def snapshot(phase: str | None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "c1", "namespace": "ns"},
        "spec": {"sandboxName": "sb1", "nodeName": "node-a"},
    }
    if phase is not None:
        body["status"] = {"phase": phase, **status}
    return body


def test_a_snapshot_returns_once_ready_and_a_fork_names_it() -> None:
    ready = snapshot("Ready", digest="sha256:ab", sizeBytes=4096)
    api = FakeApi({"c1": [snapshot(None), snapshot("Taking"), ready]})
    sb = Sandbox(api, sandbox("Running"))  # type: ignore[arg-type]
    taken = sb.snapshot()
    assert api.created[0]["spec"] == {"sandboxName": "sb1"}
    assert api.created[0]["metadata"] == {"generateName": "sb1-"}
    assert (taken.phase, taken.digest, taken.size_bytes, taken.node) == (
        "Ready",
        "sha256:ab",
        4096,
        "node-a",
    )
    assert api.deleted == []
    assert taken.pushed_image is None  # its node keeps it, and nowhere else
    pushed = "reg.example/sandlot/state:snapshot-u1@sha256:" + "2" * 64
    assert Snapshot(api, snapshot("Ready", pushedImage=pushed)).pushed_image == pushed  # type: ignore[arg-type]

    api.events["c1"] = [sandbox("Running")]
    client_with(api).create("busybox", snapshot=taken, timeout=1)
    assert api.created[-1]["spec"]["snapshotRef"] == {"name": "c1"}
    client_with(api).create("busybox", snapshot="by-name", timeout=1)
    assert api.created[-1]["spec"]["snapshotRef"] == {"name": "by-name"}


@pytest.mark.parametrize(
    ("events", "error", "said"),
    [
        ([snapshot("Pending")], TimedOut, "phase Pending; node node-a"),
        (
            [snapshot("Failed", reason="SandboxNotFound", message="no sandbox sb1")],
            CommandError,
            "it failed \\(SandboxNotFound: no sandbox sb1\\)",
        ),
        ([None], CommandError, "it was deleted"),
    ],
    ids=["never_taken", "failed", "deleted"],
)
def test_a_snapshot_that_is_not_taken_says_why_and_is_deleted(
    events: list[dict[str, Any] | None], error: type[SandlotError], said: str
) -> None:
    api = FakeApi({"c1": events})
    sb = Sandbox(api, sandbox("Running"))  # type: ignore[arg-type]
    with pytest.raises(error, match=said):
        sb.snapshot("mine", timeout=1)
    assert api.created[0]["metadata"] == {"name": "mine"}
    assert api.deleted == [("sandboxsnapshots", "c1")]
