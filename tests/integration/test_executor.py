"""Commands through a sandbox's executor, against the real containerd (both release
lines) and runc: the agent's own session code (``ExecSession`` over ``Executors``)
serves each command, as ``sandlot exec`` reaches it after the gateway. A command
forked by the executor has exactly what a runtime exec of the sandbox has (user,
groups, capabilities, seccomp, no_new_privs, cgroup, namespaces, rlimits), its
exit code, stdin, terminal and signals; a tenant that kills the executor gets its
commands through the runtime's exec (counted), and nothing it ran is left a zombie.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.containerd.execs import Execs, open_execs
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.execsession import ExecSession
from sandlot.agent.executors import Executors
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.teardown import teardown_many
from sandlot.api.sandbox import SandboxSpec
from sandlot.devtools.controlplane import executor_path
from sandlot.policy.ocispec import DEFAULT_PIDS_LIMIT, build_oci_spec
from sandlot.policy.runtimeclass import with_executor
from sandlot.policy.streams import (
    CLOSE,
    EXEC,
    RESIZE,
    STATUS,
    STDIN,
    STDOUT,
    StreamRequest,
    decode_frame,
    encode_frame,
)
from tests.support.containerd import PrivateContainerd
from tests.support.containerd_fixtures import EVERY_CONTAINERD, NODE_CAPABILITIES
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration, EVERY_CONTAINERD]

CALL_TIMEOUT = 10.0
SESSION_WAIT = 30.0


class Client:
    """The gateway's end of one exec session: frames it sends, then what it got."""

    def __init__(self, *frames: bytes) -> None:
        self.incoming: queue.Queue[bytes] = queue.Queue()
        for frame in frames:
            self.incoming.put(frame)
        self.sent: list[bytes] = []
        self.closed = threading.Event()

    def send(self, message: bytes) -> None:
        self.sent.append(message)

    def recv(self, timeout: float | None = None) -> bytes:
        if self.closed.is_set():
            raise EOFError("closed")
        try:
            return self.incoming.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def close(self) -> None:
        self.closed.set()

    def channel(self, wanted: int) -> bytes:
        frames = [decode_frame(m) for m in self.sent]
        return b"".join(data for channel, data in frames if channel == wanted)

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.channel(STATUS) or b"{}"))

    def code(self) -> int:
        status = self.status()
        if status.get("status") == "Success":
            return 0
        causes = (status.get("details") or {}).get("causes") or []
        codes = [int(c["message"]) for c in causes if c.get("reason") == "ExitCode"]
        assert codes, f"no exit code in {status}"
        return codes[0]


class Rig:
    def __init__(self, execs: Execs, container: str, metrics: AgentMetrics) -> None:
        self.execs = execs
        self.container = container
        self.metrics = metrics
        self.executors = Executors(execs, call_timeout=CALL_TIMEOUT, metrics=metrics)

    def run(
        self, *argv: str, frames: tuple[bytes, ...] = (), tty: bool = False, executor: bool = True
    ) -> Client:
        client = Client(*frames)
        stdin = bool(frames)
        asked = StreamRequest(EXEC, "ns", "sb", command=tuple(argv), stdin=stdin, tty=tty)
        session = ExecSession(
            client,
            self.execs,
            self.container,
            asked,
            call_timeout=CALL_TIMEOUT,
            stopping=lambda: False,
            idle=SESSION_WAIT,
            executors=self.executors if executor else None,
        )
        thread = threading.Thread(target=session.run, daemon=True)
        thread.start()
        thread.join(SESSION_WAIT)
        assert not thread.is_alive(), f"{argv} did not end within {SESSION_WAIT}s"
        return client

    def out(self, *argv: str, executor: bool = True) -> str:
        client = self.run(*argv, executor=executor)
        assert client.code() == 0, (argv, client.status(), client.channel(2))
        return client.channel(STDOUT).decode()

    def via(self, way: str) -> float:
        return (
            self.metrics.registry.get_sample_value("sandlot_exec_commands_total", {"via": way})
            or 0.0
        )

    def fallbacks(self, reason: str) -> float:
        return (
            self.metrics.registry.get_sample_value(
                "sandlot_exec_fallbacks_total", {"reason": reason}
            )
            or 0.0
        )


def _sandbox(
    runtime: ContainerdRuntime,
    image: str,
    log_dir: Path,
    spec: dict[str, Any],
    mount: bool,
    executor: Path | None = None,
    pids: int | None = None,
) -> str:
    container_id = f"ex-{uuid.uuid4().hex[:10]}"
    sandbox = SandboxSpec.model_validate({"image": image, "command": ["sleep", "1000"], **spec})
    config = runtime.image_config(image, timeout=10)
    oci = build_oci_spec(
        container_id,
        sandbox,
        config,
        hostname=container_id,
        node_capabilities=NODE_CAPABILITIES,
        pids_limit=pids or DEFAULT_PIDS_LIMIT,
    )
    if mount:
        oci = with_executor(oci, str(executor or executor_path()), None)
    runtime.create_container(ContainerSpec(id=container_id, image=image, oci_spec=oci), timeout=10)
    runtime.start_task(container_id, stdio=f"file://{log_dir / container_id}.log", timeout=10)
    return container_id


@pytest.fixture
def rig_factory(
    containerd: PrivateContainerd, runtime: ContainerdRuntime, busybox_image: str, tmp_path: Path
) -> Iterator[Any]:
    made: list[str] = []
    rigs: list[Rig] = []
    execs = open_execs(containerd.address, containerd.namespace, str(tmp_path / "fifos"))

    def make(
        spec: dict[str, Any] | None = None,
        *,
        mount: bool = True,
        executor: Path | None = None,
        pids: int | None = None,
    ) -> Rig:
        container = _sandbox(runtime, busybox_image, tmp_path, spec or {}, mount, executor, pids)
        made.append(container)
        rig = Rig(execs, container, AgentMetrics(CollectorRegistry()))
        rigs.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in rigs:
            rig.executors.close()
        teardown_many(runtime, made, kill_wait=3, call_timeout=5, concurrency=4)
        execs.close()


IDENTITY = (
    "grep -E '^(Uid|Gid|Groups|Cap[A-Za-z]+|NoNewPrivs|Seccomp|Seccomp_filters):' "
    "/proc/self/status; cat /proc/self/cgroup; for n in /proc/self/ns/*; do "
    "echo $n $(readlink $n); done; ulimit -a; cat /proc/self/oom_score_adj; pwd; env | sort"
)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000}},
    ],
    ids=["image-user", "uid-1000"],
)
def test_a_forked_command_has_exactly_the_identity_of_a_runtime_exec(
    rig_factory: Any, spec: dict[str, Any]
) -> None:
    rig = rig_factory(spec)
    forked = rig.out("sh", "-c", IDENTITY)
    assert rig.via("executor") == 1, "the command did not go through the executor"
    runtime = rig.out("sh", "-c", IDENTITY, executor=False)
    assert forked == runtime
    assert re.search(r"^Uid:\s+(\d+)", forked, re.M), forked
    if spec:
        assert re.search(r"^Uid:\s+1000\s", forked, re.M), forked


def test_the_sandbox_s_pids_limit_holds_its_forked_commands(rig_factory: Any) -> None:
    rig = rig_factory(pids=32)
    # ash gives up (exit 2) at the first fork the pids controller refuses. The
    # executor counts against the same limit: when the Go runtime cannot get a thread
    # then, it ends (and the session says so); the limit held either way.
    client = rig.run("sh", "-c", "for i in $(seq 64); do sleep 30 & done; echo all-forked")
    assert rig.via("executor") == 1
    assert b"all-forked" not in client.channel(STDOUT)
    status = client.status()
    if "executor" not in status.get("message", ""):
        assert b"can't fork" in client.channel(2), client.channel(2)
        assert client.code() == 2, status
    unlimited = rig_factory(pids=256)
    client = unlimited.run("sh", "-c", "for i in $(seq 64); do sleep 30 & done; echo all-forked")
    assert client.channel(STDOUT) == b"all-forked\n" and client.code() == 0


def test_exit_codes_stdin_and_a_refused_command_are_the_runtime_s(rig_factory: Any) -> None:
    rig = rig_factory()
    assert rig.run("sh", "-c", "exit 7").code() == 7
    assert rig.run("sh", "-c", "kill -TERM $$").code() == 128 + 15
    fed = rig.run(
        "cat", frames=(encode_frame(STDIN, b"hello\n"), encode_frame(CLOSE, bytes([STDIN])))
    )
    assert fed.code() == 0 and fed.channel(STDOUT) == b"hello\n"
    refused = rig.run("no-such-command")
    assert "no-such-command" in refused.status()["message"], refused.status()
    split = rig.run("sh", "-c", "echo out; echo err >&2")
    assert (split.channel(STDOUT), split.channel(2)) == (b"out\n", b"err\n")
    big = rig.run("sh", "-c", "head -c 3000000 /dev/zero")
    assert len(big.channel(STDOUT)) == 3000000
    assert rig.via("runtime") == 0 and rig.via("executor") == 5  # a refused command never started


def test_a_terminal_is_a_terminal_of_the_asked_size(rig_factory: Any) -> None:
    rig = rig_factory()
    resize = encode_frame(RESIZE, json.dumps({"Width": 91, "Height": 37}).encode())
    client = rig.run(
        "sh",
        "-c",
        "sleep 0.5; stty size; tty; echo $TERM",
        tty=True,
        frames=(resize,),
    )
    out = client.channel(STDOUT).decode()
    assert client.code() == 0, client.status()
    assert "37 91" in out and "/dev/pts/" in out and "xterm" in out, out
    assert rig.via("executor") == 1


def test_a_client_gone_kills_the_command_s_whole_process_group(rig_factory: Any) -> None:
    rig = rig_factory()
    client = Client()
    asked = StreamRequest(EXEC, "ns", "sb", command=("sh", "-c", "sleep 300 & sleep 301"))
    session = ExecSession(
        client,
        rig.execs,
        rig.container,
        asked,
        call_timeout=CALL_TIMEOUT,
        stopping=lambda: False,
        idle=SESSION_WAIT,
        executors=rig.executors,
    )
    thread = threading.Thread(target=session.run, daemon=True)
    thread.start()
    wait_for(lambda: "sleep 301" in rig.out("ps"), timeout=10, what="the command to be running")
    client.close()
    thread.join(SESSION_WAIT)
    assert not thread.is_alive()
    wait_for(
        lambda: "sleep 30" not in rig.out("ps"), timeout=10, what="its process group to be gone"
    )


def test_many_commands_leave_no_zombie(rig_factory: Any) -> None:
    rig = rig_factory()
    for _ in range(30):
        assert rig.run("sh", "-c", "sleep 0.01 & true").code() == 0
    ps = rig.out("ps", "-o", "pid,stat,comm")
    assert not [line for line in ps.splitlines()[1:] if " Z" in line], ps


def test_a_tenant_that_kills_the_executor_gets_the_runtime_s_exec_counted(
    rig_factory: Any,
) -> None:
    rig = rig_factory()
    assert rig.out("true") == ""
    ps = rig.out("ps", "-o", "pid,args")
    pid = next(line.split()[0] for line in ps.splitlines() if "/dev/.sandlot/exec" in line)
    rig.run("kill", "-9", pid)
    assert rig.out("echo", "still") == "still\n"
    assert rig.fallbacks("broken") + rig.fallbacks("backoff") >= 1, "no fallback counted"
    assert rig.via("runtime") >= 1
    # Started again once its back-off (1 s after a first death) has passed.
    forked = rig.via("executor")
    wait_for(
        lambda: rig.out("true") == "" and rig.via("executor") > forked,
        timeout=10,
        what="a command through a restarted executor",
    )
    assert (
        rig.metrics.registry.get_sample_value(
            "sandlot_executor_starts_total", {"outcome": "started"}
        )
        == 2
    )


def test_a_sandbox_without_the_executor_runs_commands_through_the_runtime(
    rig_factory: Any,
) -> None:
    rig = rig_factory(mount=False)
    assert rig.out("echo", "hi") == "hi\n"
    assert (rig.via("executor"), rig.via("runtime"), rig.fallbacks("absent")) == (0, 1, 1)


# An executor replaced by one that lies: a correct hello, then an output frame that
# claims 4 GiB. The agent refuses the header without reading on, ends it, and the
# command goes through the runtime's exec.
LIAR = """#!/bin/sh
printf '\\020\\0\\0\\0\\0\\0\\0\\0\\016sandlot-exec 1'
sleep 0.3
printf '\\023\\0\\0\\0\\001\\377\\377\\377\\377'
exec sleep 300
"""


def test_an_executor_that_breaks_the_protocol_is_ended_and_the_runtime_runs_the_command(
    rig_factory: Any, tmp_path: Path
) -> None:
    liar = tmp_path / "liar"
    liar.write_text(LIAR)
    liar.chmod(0o755)
    rig = rig_factory(executor=liar)
    assert rig.out("echo", "through", "the", "runtime") == "through the runtime\n"
    assert rig.fallbacks("broken") + rig.fallbacks("start_failed") == 1
    assert (rig.via("executor"), rig.via("runtime")) == (0, 1)
    ps = rig.out("ps", "-o", "args")
    assert "sleep 300" not in ps, f"the lying executor was left running:\n{ps}"


def test_a_command_that_reads_no_stdin_holds_back_only_itself(rig_factory: Any) -> None:
    rig = rig_factory()
    flood = tuple(encode_frame(STDIN, b"x" * 65536) for _ in range(64))  # 4 MiB
    client = Client(*flood)
    asked = StreamRequest(EXEC, "ns", "sb", command=("sleep", "60"), stdin=True)
    session = ExecSession(
        client,
        rig.execs,
        rig.container,
        asked,
        call_timeout=CALL_TIMEOUT,
        stopping=lambda: False,
        idle=3.0,  # its reader waits on the stalled stdin: the idle timeout ends it
        executors=rig.executors,
    )
    thread = threading.Thread(target=session.run, daemon=True)
    thread.start()
    try:
        # The window takes four frames (the pipe maybe one more); the next waits.
        wait_for(lambda: client.incoming.qsize() <= 60, timeout=10, what="stdin to fill up")
        for _ in range(3):
            assert rig.out("echo", "ok") == "ok\n"
        assert client.incoming.qsize() >= 50, "the command's stdin was not held back"
        assert (rig.via("executor"), rig.via("runtime")) == (4, 0)
    finally:
        client.close()
        thread.join(SESSION_WAIT)
    assert not thread.is_alive()
    assert rig.out("echo", "after") == "after\n" and rig.via("runtime") == 0
