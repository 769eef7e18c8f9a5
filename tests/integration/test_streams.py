"""``sandlot logs`` and ``sandlot exec`` end to end: the CLI, the real API server
(aggregated API ``subresources.sandlot.dev``), the stream gateway, the agent's
mutual-TLS stream server and the real containerd.

The fixtures (``tests/support/streams.py``) run them with ServiceAccount callers
holding real tokens and RBAC. The CLI runs as a subprocess with the caller's
kubeconfig. The trust tests try the path as the wrong party: a tenant of another
namespace, a user the API server lets through but the gateway does not, clients
of the agent's port that are not the gateway, and a node that records what reaches
it (never the user's token).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sandlot.adapters.agentpods import publish_agent_pod, remove_agent_pod
from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.devtools.certs import CA, Pair, StreamCerts
from sandlot.devtools.controlplane import ControlPlane, kubectl_path
from sandlot.devtools.streamnet import StreamAddress
from sandlot.gateway.runner import GatewayParts
from sandlot.policy.agentcerts import agent_server_name
from sandlot.policy.streams import SUBRESOURCE_GROUP
from tests.integration.test_agent_node import create_sandbox
from tests.support.streams import CLI_TIMEOUT, delete_sandbox, running_sandbox, sandlot
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

# ------------------------------------------------------------------------------- tests


def test_the_api_server_serves_the_streams_group_through_the_gateway(
    kube: client.ApiClient, control_plane: ControlPlane, gateway: GatewayParts
) -> None:
    groups = client.ApisApi(kube).get_api_versions()
    names = [g.name for g in groups.groups]
    assert SUBRESOURCE_GROUP in names
    raw = subprocess.run(
        [str(kubectl_path()), "get", "--raw", f"/apis/{SUBRESOURCE_GROUP}/v1alpha1"],
        env=dict(os.environ, KUBECONFIG=str(control_plane.kubeconfig)),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    resources = json.loads(raw.stdout)
    assert sorted(r["name"] for r in resources["resources"]) == [
        "sandboxes/exec",
        "sandboxes/files",
        "sandboxes/log",
        "sandboxes/portforward",
    ]


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
    assert proc.stdout is not None and proc.stderr is not None  # both PIPE
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while b"tick-12\n" not in seen:  # more than was written when it connected
            assert time.monotonic() < deadline, f"follow showed only {seen[-200:]!r}"
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"follow ended early: {proc.stderr.read()!r}"
                seen += chunk
        delete_sandbox(kube, tenant, "ticker")
        code = proc.wait(timeout=30)  # the sandbox ended: so does the stream
        assert code == 0, proc.stderr.read()
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


def test_a_viewer_reads_logs_and_is_refused_exec_by_the_api_server(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "guarded", "echo visible; sleep 1000")
    refused = sandlot(
        "exec", "guarded", "-n", tenant, "--", "echo", "hi", kubeconfig=users["onlooker"]
    )
    assert refused.returncode == 1
    assert "exec refused (403)" in refused.stderr
    assert 'cannot get resource "sandboxes/exec"' in refused.stderr, refused.stderr
    logs = wait_for(
        lambda: (
            (done := sandlot("logs", "guarded", "-n", tenant, kubeconfig=users["onlooker"]))
            and "visible" in done.stdout
            and done
        ),
        timeout=20,
        what="the viewer to read the sandbox's log",
    )
    assert logs.returncode == 0, logs.stderr
    # What `kubectl auth can-i` asks (a SelfSubjectAccessReview), as each user.
    for user, answer in (("onlooker", False), ("operator-person", True)):
        api = load_api_client(str(users[user]))
        try:
            authz: Any = client.AuthorizationV1Api(api)  # the body as plain JSON
            review = authz.create_self_subject_access_review(
                {
                    "spec": {
                        "resourceAttributes": {
                            "namespace": tenant,
                            "group": SUBRESOURCE_GROUP,
                            "resource": "sandboxes",
                            "subresource": "exec",
                            "verb": "create",
                        }
                    }
                }
            )
        finally:
            api.close()
        assert review.status.allowed is answer, (user, review.status)
    delete_sandbox(kube, tenant, "guarded")


def test_a_tenant_is_refused_every_stream_in_another_namespace(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    system, _ = places
    running_sandbox(kube, agent, system, "elsewhere", "echo private; sleep 1000")
    for command in (
        ["exec", "elsewhere", "-n", system, "--", "true"],
        ["logs", "elsewhere", "-n", system],
    ):
        refused = sandlot(*command, kubeconfig=users["operator-person"])
        assert refused.returncode == 1, refused
        assert "private" not in refused.stdout
        assert "403" in refused.stderr or "forbidden" in refused.stderr, refused.stderr
    delete_sandbox(kube, system, "elsewhere")


def test_the_gateway_reviews_the_user_itself_after_the_api_server_let_it_through(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    """``half-granted`` may ``get`` sandboxes/exec (what the API server checks for the
    WebSocket's GET) but not ``create`` it (what the gateway asks for)."""
    _, tenant = places
    running_sandbox(kube, agent, tenant, "reviewed", "sleep 1000")
    refused = sandlot(
        "exec", "reviewed", "-n", tenant, "--", "true", kubeconfig=users["half-granted"]
    )
    assert refused.returncode == 1
    assert "exec refused (403)" in refused.stderr, refused.stderr
    assert (
        f'user "system:serviceaccount:{tenant}:half-granted" cannot create sandboxes/exec '
        f'"reviewed" in namespace "{tenant}"'
    ) in refused.stderr
    delete_sandbox(kube, tenant, "reviewed")


def _handshake(ip: str, port: int, ctx: ssl.SSLContext | None, node: str) -> str:
    """What the agent's stream port answers a client with ``ctx`` (None: plain HTTP)."""
    with socket.create_connection((ip, port), timeout=10) as raw:
        try:
            name = agent_server_name(node)
            conn = ctx.wrap_socket(raw, server_hostname=name) if ctx else raw
            request = (
                "GET /sandboxes/x/y/exec HTTP/1.1\r\nHost: agent\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\nX-Sandlot-Stream-Options: command=true\r\n\r\n"
            )
            conn.sendall(request.encode())
            answer = conn.recv(4096)
        except (ssl.SSLError, ConnectionError) as e:
            return f"refused: {e}"
    return answer.decode(errors="replace").split("\r\n", 1)[0] or "refused: closed"


def test_the_agent_serves_only_the_gateways_certificate(
    agent: Agent, stream_certs: StreamCerts, tmp_path: Path
) -> None:
    ip, port = agent.settings.stream_bind, agent.settings.stream_port
    node = agent.settings.node_name
    ca = str(stream_certs.agent_ca.cert)  # the agent serves a certificate of the agent CA
    assert _handshake(ip, port, None, node).startswith("refused"), "plain HTTP was answered"
    anonymous = ssl.create_default_context(cafile=ca)
    assert _handshake(ip, port, anonymous, node).startswith("refused"), (
        "no client cert was answered"
    )
    stranger_ca = CA.create(tmp_path, "stranger-ca")
    stranger = stranger_ca.issue(tmp_path, "sandlot-gateway")  # the right name, wrong CA
    assert _handshake(ip, port, _client(ca, stranger), node).startswith("refused")
    # Another node's agent holds a certificate of the agent CA, which no agent trusts
    # for clients; nor does a gateway-named certificate of that CA pass.
    other = stream_certs.agent("another-node")
    assert _handshake(ip, port, _client(ca, other), node).startswith("refused")
    named = stream_certs.agent_ca.issue(tmp_path / "agent-ca", "sandlot-gateway")
    assert _handshake(ip, port, _client(ca, named), node).startswith("refused")
    # The gateway's own certificate gets past the handshake (then a 404: no such sandbox).
    assert _handshake(ip, port, _client(ca, stream_certs.gateway), node).startswith("HTTP/1.1 404")


def _client(ca: str, pair: Pair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(str(pair.cert), str(pair.key))
    return ctx


def test_no_users_token_reaches_a_node(
    kube: client.ApiClient,
    gateway: GatewayParts,
    places: tuple[str, str],
    users: dict[str, Path],
    stream_address: StreamAddress,
    stream_certs: StreamCerts,
) -> None:
    """A node that records everything reaching its stream port (it holds a valid
    agent certificate) sees the user's name and request, never the credential."""
    from websockets.sync.server import serve

    system, tenant = places
    seen: list[bytes] = []

    def record(connection: Any, request: Any) -> Any:
        seen.append(
            "\n".join(f"{k}: {v}" for k, v in request.headers.raw_items()).encode()
            + request.path.encode()
        )
        return connection.respond(409, "recorded\n")

    node = "recording-node"
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(stream_certs.agent(node).cert), str(stream_certs.agent(node).key))
    tls.load_verify_locations(str(stream_certs.ca.cert))
    tls.verify_mode = ssl.CERT_REQUIRED
    with serve(lambda c: None, stream_address.ip, 0, ssl=tls, process_request=record) as spy:
        threading.Thread(target=spy.serve_forever, daemon=True).start()
        port = spy.socket.getsockname()[1]
        publish_agent_pod(kube, system, f"sandlot-agent-{node}", stream_address.ip, port, node)
        try:
            create_sandbox(kube, tenant, "recorded", node)
            kubeconfig = users["operator-person"]
            token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
            done = sandlot("exec", "recorded", "-n", tenant, "--", "id", kubeconfig=kubeconfig)
        finally:
            remove_agent_pod(kube, system, f"sandlot-agent-{node}")
    assert done.returncode == 1 and "(409): recorded" in done.stderr, done.stderr
    assert len(seen) == 1, seen
    assert token.encode() not in seen[0]
    assert b"authorization" not in seen[0].lower()
    assert f"system:serviceaccount:{tenant}:operator-person".encode() in seen[0]
    delete_sandbox(kube, tenant, "recorded")


def test_a_busy_stream_port_is_one_line_naming_the_settings() -> None:
    import socket
    import threading

    from sandlot.adapters.startup import StartupError
    from sandlot.agent.streams import StreamServer

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        server = StreamServer(
            "node-x",
            bind="127.0.0.1",
            port=port,
            tls=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER),
            client_names=("sandlot-gateway",),
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


def test_a_stream_id_is_opened_once_so_a_retried_upgrade_never_runs_twice(
    kube: client.ApiClient, agent: Agent, stream_certs: StreamCerts, places: tuple[str, str]
) -> None:
    """The gateway tries an upgrade the agent never answered once more, under the same
    stream id: the agent runs the first it took and refuses the second, so a command
    never runs twice. Played straight to the agent with the gateway's certificate."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from sandlot.policy.streams import (
        EXEC,
        STATUS,
        STDOUT,
        STREAM_ID_HEADER,
        STREAM_OPTIONS_HEADER,
        SUBPROTOCOL,
        StreamRequest,
        agent_request,
        decode_frame,
    )

    _, tenant = places
    running_sandbox(kube, agent, tenant, "once", "sleep 1000")
    node = agent.settings.node_name
    tls = _client(str(stream_certs.agent_ca.cert), stream_certs.gateway)

    def run(stream_id: str, script: str) -> bytes:
        """The command's output, through one stream opened under ``stream_id``."""
        path, options = agent_request(
            StreamRequest(EXEC, tenant, "once", command=("sh", "-c", script))
        )
        out = b""
        with connect(
            f"wss://{agent.settings.stream_bind}:{agent.settings.stream_port}{path}",
            ssl=tls,
            server_hostname=agent_server_name(node),
            additional_headers={STREAM_OPTIONS_HEADER: options, STREAM_ID_HEADER: stream_id},
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            compression=None,
            open_timeout=30,
        ) as ws:
            while True:
                channel, chunk = decode_frame(bytes(ws.recv(timeout=30)))  # type: ignore[arg-type]
                if channel == STATUS:
                    return out
                if channel == STDOUT:
                    out += chunk

    append = "echo ran >> /tmp/runs"
    run("stream-1", append)
    with pytest.raises(InvalidStatus) as again:
        run("stream-1", append)
    assert again.value.response.status_code == 409
    assert b"opened already" in again.value.response.body
    run("stream-2", append)  # another id is another stream
    assert run("stream-3", "cat /tmp/runs") == b"ran\nran\n"
    delete_sandbox(kube, tenant, "once")
