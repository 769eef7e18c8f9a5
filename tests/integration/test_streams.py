"""``sandlot logs`` and ``sandlot exec`` end to end: the CLI, the real API server's
pods/proxy, the agent's stream server and the real containerd.

The agent's stream server listens on an address of an interface this module
creates (the API server proxies only to a global-unicast pod IP), recorded as the
IP of the agent's stand-in Pod, as ``sandlot dev`` and the demo do. Callers are
ServiceAccounts with real tokens and real RBAC: one may read logs and exec, one may
only reach the proxy. The CLI runs as a subprocess with the caller's kubeconfig.
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
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.agentpods import publish_agent_pod, remove_agent_pod
from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.containerd import PrivateContainerd
from sandlot.devtools.controlplane import ControlPlane, free_port, kubeconfig_dict, kubectl_path
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from sandlot.devtools.streamnet import StreamAddress, can_create
from tests.integration.test_agent_node import _cleanup_namespace, create_sandbox, wait_phase
from tests.support.agents import agent_settings
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

IMAGE = "docker.io/sandlot/agent-busybox:test"
CLI_TIMEOUT = 60


@pytest.fixture(scope="module")
def stream_address() -> Iterator[StreamAddress]:
    if not can_create():
        pytest.skip("creating the stream address's interface needs root")
    with StreamAddress() as address:
        yield address


def _create_namespace(kube: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(kube).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture(scope="module")
def places(kube: client.ApiClient) -> Iterator[tuple[str, str]]:
    """(the agent's namespace, the tenant's namespace)."""
    system, tenant = _create_namespace(kube, "sys"), _create_namespace(kube, "tenant")
    yield system, tenant
    for name in (system, tenant):
        client.CoreV1Api(kube).delete_namespace(name)


@pytest.fixture(scope="module")
def agent(
    kube: client.ApiClient,
    containerd: PrivateContainerd,
    places: tuple[str, str],
    stream_address: StreamAddress,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Agent]:
    system, _ = places
    workdir = tmp_path_factory.mktemp("streams")
    ctr_ns = f"streams-{uuid.uuid4().hex[:8]}"
    archive = workdir / "busybox.tar"
    build_image_archive(archive, IMAGE)
    import_archive(containerd.address, ctr_ns, archive, timeout=60)
    node = f"node-{uuid.uuid4().hex[:8]}"
    port = free_port()
    pod = f"sandlot-agent-{node}"
    publish_agent_pod(kube, system, pod, stream_address.ip, port)
    settings = agent_settings(
        node=node,
        namespace=system,
        containerd=containerd,
        ctr_ns=ctr_ns,
        log_dir=workdir / "logs",
        stream_port=port,
        stream_bind=stream_address.ip,
        stream_pod=pod,
        log_interval="0.2s",
    )
    started = Agent(settings, kube, registry=CollectorRegistry())
    try:
        assert started.start(), "the agent did not start"
        yield started
    finally:
        started.shutdown()
        remove_agent_pod(kube, system, pod)
        _cleanup_namespace(containerd.address, ctr_ns)


def _user_kubeconfig(
    kube: client.ApiClient,
    plane: ControlPlane,
    namespace: str,
    user: str,
    workdir: Path,
) -> Path:
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": user}})
    token = core.create_namespaced_service_account_token(
        user, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    path = workdir / f"{user}.kubeconfig"
    path.write_text(
        yaml.safe_dump(kubeconfig_dict(plane.url, str(plane.ca_file), user, token=token))
    )
    return path


def _grant(
    kube: client.ApiClient,
    namespace: str,
    name: str,
    rules: list[dict[str, Any]],
    subject: tuple[str, str],
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "namespace": subject[0], "name": subject[1]}],
        },
    )


PROXY = [{"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get", "create"]}]
STREAMS = [
    {"apiGroups": [GROUP], "resources": ["sandboxes"], "verbs": ["get", "exec"]},
    {"apiGroups": [GROUP], "resources": ["sandboxes/log"], "verbs": ["get"]},
]
READ_ONLY = [{"apiGroups": [GROUP], "resources": ["sandboxes"], "verbs": ["get"]}]


@pytest.fixture(scope="module")
def users(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    places: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Path]]:
    """``operator-person`` may read logs and exec; ``onlooker`` may only reach the proxy."""
    system, tenant = places
    workdir = tmp_path_factory.mktemp("users")
    configs = {}
    for user, rules in (("operator-person", STREAMS), ("onlooker", READ_ONLY)):
        configs[user] = _user_kubeconfig(kube, control_plane, tenant, user, workdir)
        _grant(kube, system, f"{user}-proxy", PROXY, (tenant, user))
        _grant(kube, tenant, f"{user}-sandboxes", rules, (tenant, user))
    rbac = client.RbacAuthorizationV1Api(kube)
    nodes = f"read-sandboxnodes-{tenant}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": nodes},
            "rules": [{"apiGroups": [GROUP], "resources": ["sandboxnodes"], "verbs": ["get"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": nodes},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": nodes,
            },
            "subjects": [
                {"kind": "ServiceAccount", "namespace": tenant, "name": user} for user in configs
            ],
        }
    )
    yield configs
    rbac.delete_cluster_role_binding(nodes)
    rbac.delete_cluster_role(nodes)


def sandlot(
    command: str, *args: str, kubeconfig: Path, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``sandlot COMMAND --kubeconfig FILE ARGS...`` (before any ``--`` of exec)."""
    return subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", command, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _running(
    kube: client.ApiClient, agent: Agent, namespace: str, name: str, script: str
) -> dict[str, Any]:
    create_sandbox(kube, namespace, name, agent.node, command=["sh", "-c", script])
    sandbox = wait_phase(kube, namespace, name, "Running", timeout=30)
    wait_for(
        lambda: (
            (agent.sandbox_watch.get(f"{namespace}/{name}") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        timeout=10,
        what="the agent's watch to see the sandbox Running",
    )
    return sandbox


def _delete(kube: client.ApiClient, namespace: str, name: str) -> None:
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )


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
    _running(
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
    _delete(kube, tenant, "counter")


def test_logs_follow_streams_new_output_and_ends_with_the_sandbox(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    _running(
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
        _delete(kube, tenant, "ticker")
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
    _running(kube, agent, tenant, "shell", "sleep 1000")
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
    _delete(kube, tenant, "shell")


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
    _running(kube, agent, tenant, "interactive", "sleep 1000")
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
        _delete(kube, tenant, "interactive")


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
    _running(kube, agent, tenant, "guarded", "echo secret; sleep 1000")
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
    can_i = subprocess.run(
        [str(kubectl_path()), "auth", "can-i", "exec", "sandboxes", "-n", tenant],
        capture_output=True,
        text=True,
        env=dict(os.environ, KUBECONFIG=str(users["onlooker"])),
        timeout=30,
        check=False,
    )
    assert can_i.stdout.strip() == "no"
    _delete(kube, tenant, "guarded")


def test_the_api_server_strips_authorization_so_the_token_travels_in_its_own_header(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    """Without the agent's own header the agent sees no identity at all: the API
    server removed ``Authorization`` after authenticating the caller."""
    import websocket

    system, tenant = places
    _running(kube, agent, tenant, "bare", "sleep 1000")
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
    _delete(kube, tenant, "bare")
