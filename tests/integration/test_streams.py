"""``sandlot logs`` and ``sandlot exec`` end to end: the CLI, the real API server's
pods/proxy, the agent's stream server and the real containerd.

The fixtures (``tests/support/streams.py``) run a real agent whose stream server
the API server proxies to, and two ServiceAccount callers with real tokens and
RBAC: one may read logs and exec, one may only reach the proxy. The CLI runs as a
subprocess with the caller's kubeconfig.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import kubectl_path
from tests.support.streams import CLI_TIMEOUT, delete_sandbox, running_sandbox, sandlot
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

# ------------------------------------------------------------------------------- tests


def test_the_agent_names_its_stream_path_on_its_sandbox_node(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str]
) -> None:
    system, _ = places
    node = client.CustomObjectsApi(kube).get_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", agent.node
    )
    assert node["status"]["streamPath"] == (
        f"/api/v1/namespaces/{system}/pods/{agent.settings.stream_pod}:{agent.settings.stream_port}/proxy"
    )


def test_logs_prints_output_and_tail_takes_the_last_lines(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(
        kube, agent, tenant, "counter", "for i in 1 2 3 4 5; do echo line-$i; done; sleep 1000"
    )
    kubeconfig = users["operator-person"]

    def all_lines() -> str | None:
        done = sandlot("logs", "counter", "-n", tenant, kubeconfig=kubeconfig)
        assert done.returncode == 0, done.stderr
        return done.stdout if "line-5" in done.stdout else None

    out = wait_for(all_lines, timeout=20, what="sandlot logs to show the five lines")
    assert out.splitlines() == [f"line-{i}" for i in range(1, 6)]
    tail = sandlot("logs", "counter", "-n", tenant, "--tail", "2", kubeconfig=kubeconfig)
    assert (tail.returncode, tail.stdout.splitlines()) == (0, ["line-4", "line-5"])
    delete_sandbox(kube, tenant, "counter")


def test_logs_follow_streams_new_output_and_ends_with_the_sandbox(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(
        kube,
        agent,
        tenant,
        "ticker",
        "i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.2; done",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandlot.cli.main",
            "logs",
            "ticker",
            "-n",
            tenant,
            "-f",
            "--kubeconfig",
            str(users["operator-person"]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while b"tick-12\n" not in seen:  # more than was written when it connected
            assert time.monotonic() < deadline, f"follow showed only {seen[-200:]!r}"
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)  # type: ignore[union-attr]
                assert chunk, f"follow ended early: {proc.stderr.read()!r}"  # type: ignore[union-attr]
                seen += chunk
        delete_sandbox(kube, tenant, "ticker")
        code = proc.wait(timeout=30)  # the sandbox ended: so does the stream
        assert code == 0, proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_exec_prints_the_commands_output_and_exits_with_its_code(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "shell", "sleep 1000")
    kubeconfig = users["operator-person"]
    done = sandlot(
        "exec", "shell", "-n", tenant, "--", "echo", "hello", "from", "exec", kubeconfig=kubeconfig
    )
    assert (done.returncode, done.stdout) == (0, "hello from exec\n"), done.stderr
    failed = sandlot(
        "exec",
        "shell",
        "-n",
        tenant,
        "--",
        "sh",
        "-c",
        "echo oops >&2; exit 7",
        kubeconfig=kubeconfig,
    )
    assert (failed.returncode, failed.stdout, failed.stderr) == (7, "", "oops\n")
    # The same as a kubectl plugin (kubectl-sandlot beside this interpreter).
    plugin = subprocess.run(
        [str(kubectl_path()), "sandlot", "exec", "shell", "-n", tenant, "--", "sh", "-c", "exit 4"],
        env=dict(
            os.environ,
            KUBECONFIG=str(kubeconfig),
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        ),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert plugin.returncode == 4, plugin.stderr
    delete_sandbox(kube, tenant, "shell")


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {needle!r}; saw {seen[-300:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}; saw {seen[-300:]!r}"
            seen += chunk
    return seen


def test_exec_it_runs_an_interactive_shell_in_a_terminal_that_resizes(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "interactive", "sleep 1000")
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandlot.cli.main",
            "exec",
            "interactive",
            "-n",
            tenant,
            "-it",
            "--kubeconfig",
            str(users["operator-person"]),
            "--",
            "sh",
        ],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    try:
        _read_until(controller, b"/ # ", timeout=30)  # the shell's prompt: it reads lines now
        os.write(controller, b"echo sum=$((40+2))\n")
        _read_until(controller, b"sum=42", timeout=30)
        os.write(controller, b"busybox stty size\n")
        _read_until(controller, b"24 80", timeout=15)
        fcntl.ioctl(controller, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        os.kill(proc.pid, signal.SIGWINCH)
        wait_for(
            lambda: _size_seen(controller), timeout=15, what="the new size 33x101 in the shell"
        )
        os.write(controller, b"exit 3\n")
        assert proc.wait(timeout=30) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(controller)
        delete_sandbox(kube, tenant, "interactive")


def _size_seen(controller: int) -> bool:
    os.write(controller, b"busybox stty size\n")
    try:
        _read_until(controller, b"33 101", timeout=2)
    except AssertionError:
        return False
    return True


def test_a_user_without_the_verb_gets_403_naming_what_it_may_not_do(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "guarded", "echo secret; sleep 1000")
    refused = sandlot(
        "exec", "guarded", "-n", tenant, "--", "echo", "hi", kubeconfig=users["onlooker"]
    )
    assert refused.returncode == 1
    assert "exec refused (403)" in refused.stderr
    assert (
        f'user "system:serviceaccount:{tenant}:onlooker" cannot exec in sandboxes "guarded"'
        in refused.stderr
    )
    logs = sandlot("logs", "guarded", "-n", tenant, kubeconfig=users["onlooker"])
    assert logs.returncode == 1 and "log refused (403)" in logs.stderr
    assert "secret" not in logs.stdout
    # `kubectl auth can-i` answers exactly what the agent asks.
    for user, answer in (("onlooker", "no"), ("operator-person", "yes")):
        can_i = subprocess.run(
            [str(kubectl_path()), "auth", "can-i", "exec", "sandboxes", "-n", tenant],
            capture_output=True,
            text=True,
            env=dict(os.environ, KUBECONFIG=str(users[user])),
            timeout=30,
            check=False,
        )
        assert can_i.stdout.strip() == answer, (user, can_i.stderr)
    delete_sandbox(kube, tenant, "guarded")


def test_the_api_server_strips_authorization_so_the_token_travels_in_its_own_header(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    """Without the agent's own header the agent sees no identity at all: the API
    server removed ``Authorization`` after authenticating the caller."""
    import websocket

    system, tenant = places
    running_sandbox(kube, agent, tenant, "bare", "sleep 1000")
    api = load_api_client(str(users["operator-person"]))
    try:
        token = api.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        host = api.configuration.host.removeprefix("https://")
        url = f"wss://{host}/api/v1/namespaces/{system}/pods/{agent.settings.stream_pod}:{agent.settings.stream_port}/proxy/sandboxes/{tenant}/bare/exec?command=true"
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(
                url,
                header=[f"Authorization: {token}", "X-Sandlot-Stream-Options: command=true"],
                subprotocols=["v5.channel.k8s.io"],
                sslopt={"ca_certs": api.configuration.ssl_ca_cert},
                http_no_proxy=["*"],
                timeout=20,
            )
    finally:
        api.close()
    assert refused.value.status_code == 401
    assert b"X-Sandlot-Authorization" in (refused.value.resp_body or b"")
    delete_sandbox(kube, tenant, "bare")


def test_a_busy_stream_port_is_one_line_naming_the_settings() -> None:
    import socket
    import threading

    from sandlot.adapters.startup import StartupError
    from sandlot.agent.streams import StreamServer

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        server = StreamServer(
            None,
            "node-x",
            bind="127.0.0.1",
            port=port,
            sandbox=lambda _key: None,
            log_dir="",
            execs=None,
            call_timeout=1.0,
            stop=threading.Event(),
        )
        with pytest.raises(StartupError) as refused:
            server.start()
    message = str(refused.value)
    assert "--stream-port / SANDLOT_STREAM_PORT" in message
    assert f"127.0.0.1:{port}: cannot listen: address already in use" in message
    assert "\n" not in message
