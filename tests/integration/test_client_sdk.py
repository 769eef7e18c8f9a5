"""``sandlot.client`` end to end: the SDK as a tenant's program uses it, through the
real API server, the gateway, the agent and a real containerd sandbox (the
fixtures of ``tests/support/streams.py``).

No operator runs here, so the test does the operator's one write each time: it
schedules the sandbox ``create`` made (status Scheduled on the agent's node), and
binds the claim ``claim`` made (status Bound, as ``controllers/claims.py`` writes
it). Everything the SDK waits for, it waits for by its own watch. A claim bound
by the real operator: tests/integration/test_client_claims.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.client import (
    AsyncClient,
    Channel,
    Client,
    CommandError,
    FileError,
    Forbidden,
    Result,
    SandboxGone,
    SandboxNotFound,
    TimedOut,
)
from sandlot.devtools.controlplane import ControlPlane
from tests.support.streams import (
    EDIT,
    IMAGE,
    _grant,
    _user_kubeconfig,
    delete_sandbox,
    running_sandbox,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

FED_RUNS = 200

# What a program that makes its own sandboxes needs on top of sandlot-edit.
MAKER = [
    *EDIT,
    {
        "apiGroups": [GROUP],
        "resources": ["sandboxes", "sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "delete", "patch"],
    },
]


@pytest.fixture(scope="module")
def maker(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    places: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The kubeconfig of ``program``, a ServiceAccount that may make sandboxes and
    claims in the tenant's namespace and use their streams."""
    _, tenant = places
    path = _user_kubeconfig(kube, control_plane, tenant, "program", tmp_path_factory.mktemp("sdk"))
    _grant(kube, tenant, "program-sandboxes", MAKER, (tenant, "program"))
    return path


def _custom(kube: client.ApiClient) -> Any:
    return client.CustomObjectsApi(kube)  # custom objects: plain JSON


def _get(kube: client.ApiClient, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(
            _custom(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _as_operator(
    kube: client.ApiClient, plural: str, namespace: str, name: str, status: dict[str, Any]
) -> None:
    """Once ``name`` exists, write the ``status`` the operator would."""
    wait_for(
        lambda: _get(kube, plural, namespace, name) is not None,
        timeout=20,
        what=f"the SDK to create {plural}/{name}",
    )
    _custom(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, plural, name, {"status": status}
    )


def _meanwhile(call: Callable[[], Any]) -> tuple[ThreadPoolExecutor, Future[Any]]:
    pool = ThreadPoolExecutor(1)
    return pool, pool.submit(call)


def test_a_program_creates_runs_streams_moves_files_and_terminates(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    sdk = Client(maker, namespace=tenant)
    pool, made = _meanwhile(
        lambda: sdk.create(
            IMAGE, ["sleep", "1000"], name="sdk-made", node_name=agent.node, timeout=60
        )
    )
    with pool:
        _as_operator(kube, "sandboxes", tenant, "sdk-made", {"phase": "Scheduled"})
        sb = made.result(timeout=90)
    assert (sb.name, sb.phase) == ("sdk-made", "Running")

    with sb:
        # run: exit code, stdout and stderr apart, stdin, env and cwd
        result = sb.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)
        assert sb.run(["cat"], stdin=b"fed\n").stdout == b"fed\n"
        with pytest.raises(CommandError, match="no-such-program"):
            sb.run(["no-such-program"])
        shaped = sb.run('echo "$GREETING from $(pwd)"', env={"GREETING": "hi there"}, cwd="/tmp")
        assert shaped.text == "hi there from /tmp\n"

        # a timeout ends the command, and says so with what came before
        began = time.monotonic()
        with pytest.raises(TimedOut) as timed:
            sb.run(["sh", "-c", "echo partial; sleep 30"], timeout=2)
        assert time.monotonic() - began < 15
        assert timed.value.stdout == b"partial\n"
        wait_for(
            lambda: "sleep 30" not in sb.run(["ps", "-o", "args"]).text,
            timeout=20,
            what="the timed-out command to be killed",
        )

        # stream: output arrives while the command still runs
        seen: list[tuple[Channel, bytes, float]] = []
        began = time.monotonic()
        with sb.stream(["sh", "-c", "echo first; sleep 2; echo second >&2"]) as out:
            for channel, data in out:
                seen.append((channel, data, time.monotonic() - began))
        assert [(c, d) for c, d, _ in seen] == [
            (Channel.STDOUT, b"first\n"),
            (Channel.STDERR, b"second\n"),
        ]
        assert seen[0][2] < 1.5, "the first line came only with the end"
        assert out.exit_code == 0

        # files: round trip, list, stat, exists, remove; refusals with their code
        payload = bytes(range(256)) * 1024
        sb.files.write("/tmp/data.bin", payload)
        assert sb.files.read("/tmp/data.bin") == payload
        assert sb.files.stat("/tmp/data.bin").size == len(payload)
        assert "data.bin" in {f.name for f in sb.files.list("/tmp")}
        assert sb.files.exists("/tmp/data.bin")
        sb.files.remove("/tmp/data.bin")
        assert not sb.files.exists("/tmp/data.bin")
        with pytest.raises(FileError) as missing:
            sb.files.read("/tmp/data.bin")
        assert missing.value.status == 404
        with pytest.raises(FileError) as escaped:
            sb.files.read("/../../../../etc/shadow")
        assert escaped.value.status == 403 and "outside the sandbox's root" in str(escaped.value)

    # leaving the block terminated it
    wait_for(
        lambda: _get(kube, "sandboxes", tenant, "sdk-made") is None,
        timeout=20,
        what="the terminated sandbox to be deleted",
    )
    with pytest.raises(SandboxNotFound):
        sdk.get("sdk-made")
    sdk.close()


def test_a_caller_without_the_rights_gets_forbidden(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "watched", "sleep 1000")
    with Client(users["onlooker"], namespace=tenant) as sdk:
        sb = sdk.get("watched")  # sandlot-view may read the object...
        with pytest.raises(Forbidden, match="exec"):
            sb.run(["true"])  # ...but not exec in it,
        with pytest.raises(Forbidden, match="files"):
            sb.files.read("/etc/hostname")  # nor read its files,
        with pytest.raises(Forbidden):
            sdk.create(IMAGE, ["true"], timeout=5)  # nor make sandboxes.
    delete_sandbox(kube, tenant, "watched")


def test_a_sandbox_deleted_mid_command_raises_sandbox_gone(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "doomed", "sleep 1000")
    with Client(maker, namespace=tenant) as sdk:
        sb = sdk.get("doomed")
        out = sb.stream(["sh", "-c", "echo started; sleep 60"], timeout=60)
        frames = iter(out)
        assert next(frames) == (Channel.STDOUT, b"started\n")  # the command is running
        delete_sandbox(kube, tenant, "doomed")
        began = time.monotonic()
        with pytest.raises(SandboxGone) as gone:
            list(frames)
        assert time.monotonic() - began < 40
        assert gone.value.phase is None and "deleted" in str(gone.value)


def test_claim_returns_the_bound_sandbox_and_terminate_releases_the_claim(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    member = running_sandbox(kube, agent, tenant, "warm-member", "sleep 1000")
    sdk = Client(maker, namespace=tenant)
    pool, claimed = _meanwhile(lambda: sdk.claim("warm", name="mine", timeout=30))
    with pool:
        _as_operator(
            kube,
            "sandboxclaims",
            tenant,
            "mine",
            {
                "phase": "Bound",
                "sandboxName": "warm-member",
                "address": member["status"].get("ip"),
                "nodeName": agent.node,
            },
        )
        sb = claimed.result(timeout=40)
    with sb:
        assert (sb.name, sb.claim) == ("warm-member", "mine")
        assert sb.run(["echo", "claimed"]).stdout == b"claimed\n"
    wait_for(
        lambda: _get(kube, "sandboxclaims", tenant, "mine") is None,
        timeout=20,
        what="the claim to be deleted by terminate",
    )
    sdk.close()
    delete_sandbox(kube, tenant, "warm-member")


def test_the_async_twin_runs_streams_and_reads_files(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "awaited", "echo hello > /tmp/greeting; sleep 1000")

    async def program() -> tuple[Result, list[tuple[Channel, bytes]], bytes]:
        async with AsyncClient(maker, namespace=tenant) as sdk:
            sb = await sdk.get("awaited")
            ran = await sb.run(["sh", "-c", "exit 4"])
            streamed = [item async for item in sb.stream(["echo", "streamed"])]
            greeting = await sb.files.read("/tmp/greeting")
            return ran, streamed, greeting

    ran, streamed, greeting = asyncio.run(asyncio.wait_for(program(), timeout=60))
    assert ran.exit_code == 4
    assert streamed == [(Channel.STDOUT, b"streamed\n")]
    assert greeting == b"hello\n"
    delete_sandbox(kube, tenant, "awaited")


def test_port_tunnels_parallel_connections_to_a_server_in_the_sandbox(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    running_sandbox(
        kube,
        agent,
        tenant,
        "served",
        "mkdir -p /www && echo hello-through-the-sdk > /www/index.html && "
        "exec httpd -f -p 127.0.0.1:8080 -h /www",
    )
    with Client(maker, namespace=tenant) as sdk:
        sb = sdk.get("served")
        with sb.port(8080) as tunnel:

            def fetch(_: int) -> bytes:
                deadline = time.monotonic() + 30
                while True:  # httpd may still be starting: a refused connection is retried
                    try:
                        with urllib.request.urlopen(f"{tunnel.url}/index.html", timeout=10) as r:
                            return bytes(r.read())
                    except OSError:
                        if time.monotonic() > deadline:
                            raise AssertionError(f"no answer in 30s: {tunnel.last_error}") from None
                        time.sleep(0.2)

            with ThreadPoolExecutor(4) as pool:
                assert list(pool.map(fetch, range(4))) == [b"hello-through-the-sdk\n"] * 4
        with pytest.raises(OSError):
            socket.create_connection(tunnel.address, timeout=5)  # closed with its block
    delete_sandbox(kube, tenant, "served")


def test_a_sandbox_stopped_mid_command_says_which_phase_and_why(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "expiring", "sleep 1000")
    with Client(maker, namespace=tenant) as sdk:
        sb = sdk.get("expiring")
        frames = iter(sb.stream(["sh", "-c", "echo started; sleep 60"], timeout=60))
        assert next(frames) == (Channel.STDOUT, b"started\n")
        # What the operator writes at a sandbox's deadline; the agent then stops it.
        _custom(kube).patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            tenant,
            "sandboxes",
            "expiring",
            {"status": {"phase": "Stopped", "reason": "DeadlineExceeded", "message": "past 5s"}},
        )
        with pytest.raises(SandboxGone) as gone:
            list(frames)
        assert (gone.value.phase, gone.value.reason) == ("Stopped", "DeadlineExceeded")
        assert "Stopped (DeadlineExceeded): past 5s" in str(gone.value)
    delete_sandbox(kube, tenant, "expiring")


def test_pause_returns_once_frozen_and_resume_once_running_again(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "dozing", "sleep 1000")
    with Client(maker, namespace=tenant) as sdk:
        sb = sdk.get("dozing")
        assert sb.pause(timeout=60) is sb
        # returned only once the agent recorded the freeze: no wait here
        paused = [c for c in sb.body["status"]["conditions"] if c["type"] == "Paused"]
        assert [(c["status"], c["reason"]) for c in paused] == [("True", "Paused")]
        with pytest.raises(CommandError, match="Paused"):
            sb.run(["true"])
        sb.resume(timeout=60)
        assert sb.run(["echo", "awake"]).stdout == b"awake\n"

    async def program() -> bytes:
        async with AsyncClient(maker, namespace=tenant) as sdk:
            sb = await sdk.get("dozing")
            await sb.pause(timeout=60)
            await sb.resume(timeout=60)
            return (await sb.run(["echo", "again"])).stdout

    assert asyncio.run(asyncio.wait_for(program(), timeout=150)) == b"again\n"
    delete_sandbox(kube, tenant, "dozing")


def test_commands_fed_stdin_from_parallel_callers_each_end_with_their_status(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    """Each ``run`` with stdin writes its stdin on a thread of its own while the caller
    waits for output: the stream's socket once saw those two at once (a spurious end
    of stream: "the stream ended before its status came"), and the gateway's request
    to the agent was lost to a TLS session ticket the agent sent meanwhile (a 30 s
    hang). Many short commands from parallel callers make both likely."""
    _, tenant = places
    running_sandbox(kube, agent, tenant, "fed", "sleep 1000")
    sb = Client(maker, namespace=tenant).get("fed")
    failures: list[str] = []

    def one(i: int) -> None:
        try:
            result = sb.run(["cat"], stdin=f"line {i}\n", timeout=60)
            if (result.stdout, result.exit_code) != (f"line {i}\n".encode(), 0):
                failures.append(f"run {i}: {result}")
        except Exception as e:  # collected: the assertion names every failed run
            failures.append(f"run {i}: {e!r}")

    try:
        with ThreadPoolExecutor(4) as pool:
            done = list(pool.map(one, range(FED_RUNS)))
        assert len(done) == FED_RUNS
        assert not failures, f"{len(failures)} of {FED_RUNS} runs failed: {failures[:5]}"
    finally:
        delete_sandbox(kube, tenant, "fed")


def test_suspend_returns_once_committed_and_resume_brings_the_files_back(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], maker: Path
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "stored", "sleep 1000")
    with Client(maker, namespace=tenant) as sdk:
        sb = sdk.get("stored")
        sb.run(["sh", "-c", "echo kept > /tmp/state"])
        assert sb.suspend(timeout=60) is sb
        said = [c for c in sb.body["status"]["conditions"] if c["type"] == "Suspended"]
        assert [(c["status"], c["reason"]) for c in said] == [("True", "Suspended")]
        with pytest.raises(CommandError, match="Suspended"):
            sb.run(["true"])
        sb.resume(timeout=60)
        assert sb.run(["cat", "/tmp/state"]).stdout == b"kept\n"

    async def program() -> bytes:
        async with AsyncClient(maker, namespace=tenant) as sdk:
            sb = await sdk.get("stored")
            await sb.suspend(timeout=60)
            await sb.resume(timeout=60)
            return (await sb.run(["cat", "/tmp/state"])).stdout

    assert asyncio.run(asyncio.wait_for(program(), timeout=150)) == b"kept\n"
    delete_sandbox(kube, tenant, "stored")
