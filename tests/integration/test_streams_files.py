"""``sandlot cp``, ``sandlot port-forward`` and the stream caps, end to end: the CLI,
the real API server, the gateway, the agent and a real containerd sandbox.

The fixtures are those of ``tests/integration/test_streams.py``
(``tests/support/streams.py``). The abuse is done for real: a symlink to the node's
``/etc/shadow`` and a ``..`` path asked for by name, a write past the cap, more
streams than a user may hold.
"""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from sandlot.devtools.controlplane import free_port
from sandlot.gateway.runner import GatewayParts
from tests.support.streams import delete_sandbox, running_sandbox, sandlot
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

MiB = 2**20


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


def test_cp_moves_100_mib_in_and_out_unchanged(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "files", "sleep 1000")
    kubeconfig = users["operator-person"]
    big = tmp_path / "big"
    with open(big, "wb") as f:
        for _ in range(100):
            f.write(os.urandom(MiB))
    up = sandlot("cp", str(big), "files:/tmp/big", "-n", tenant, kubeconfig=kubeconfig, timeout=180)
    assert up.returncode == 0, up.stderr
    seen = sandlot(
        "exec", "files", "-n", tenant, "--", "sh", "-c", "wc -c < /tmp/big", kubeconfig=kubeconfig
    )
    assert seen.stdout.strip() == str(100 * MiB), seen
    back = tmp_path / "back"
    down = sandlot(
        "cp", "files:/tmp/big", str(back), "-n", tenant, kubeconfig=kubeconfig, timeout=180
    )
    assert down.returncode == 0, down.stderr
    assert _digest(back) == _digest(big)
    delete_sandbox(kube, tenant, "files")


def test_cp_refuses_paths_that_leave_the_sandbox_and_writes_past_the_cap(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    running_sandbox(
        kube, agent, tenant, "escape", "ln -s /etc/shadow /tmp/shadow; ln -s / /tmp/up; sleep 1000"
    )
    kubeconfig = users["operator-person"]
    wait_for(
        lambda: (
            "shadow"
            in sandlot(
                "exec", "escape", "-n", tenant, "--", "ls", "/tmp", kubeconfig=kubeconfig
            ).stdout
        ),
        timeout=20,
        what="the sandbox's symlinks",
    )
    host_shadow = Path("/etc/shadow").read_bytes()
    for path in ("/tmp/shadow", "/../../../../etc/shadow", "/tmp/up/../../etc/shadow"):
        out = tmp_path / "out"
        got = sandlot("cp", f"escape:{path}", str(out), "-n", tenant, kubeconfig=kubeconfig)
        assert got.returncode == 1, (path, got)
        assert "outside the sandbox's root" in got.stderr, (path, got.stderr)
        assert not out.exists() or out.read_bytes() != host_shadow
    # The same for a write: the node's file is never touched.
    payload = tmp_path / "payload"
    payload.write_bytes(b"owned\n")
    wrote = sandlot("cp", str(payload), "escape:/tmp/shadow", "-n", tenant, kubeconfig=kubeconfig)
    # Replacing the link itself is inside the root: the link goes, /etc/shadow stays.
    assert wrote.returncode == 0, wrote.stderr
    assert Path("/etc/shadow").read_bytes() == host_shadow
    through = sandlot(
        "cp", str(payload), "escape:/tmp/up/etc/x", "-n", tenant, kubeconfig=kubeconfig
    )
    assert through.returncode == 1 and "outside the sandbox's root" in through.stderr
    assert not Path("/etc/x").exists()
    # Past the cap (the fixture's agent allows 120 MiB): refused, naming the cap.
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.truncate(121 * MiB)
    over = sandlot(
        "cp", str(huge), "escape:/tmp/huge", "-n", tenant, kubeconfig=kubeconfig, timeout=180
    )
    assert over.returncode == 1
    assert f"more than the {120 * MiB}-byte cap" in over.stderr, over.stderr
    listing = sandlot(
        "exec", "escape", "-n", tenant, "--", "ls", "-a", "/tmp", kubeconfig=kubeconfig
    )
    assert "huge" not in listing.stdout, "a refused write leaves nothing behind"
    delete_sandbox(kube, tenant, "escape")


def test_port_forward_carries_several_connections_into_the_sandbox(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(
        kube,
        agent,
        tenant,
        "web",
        "mkdir -p /www && echo hello-through-the-gateway > /www/index.html && "
        "exec httpd -f -p 127.0.0.1:8080 -h /www",
    )
    local = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandlot.cli.main",
            "port-forward",
            "web",
            f"{local}:8080",
            "-n",
            tenant,
            "--kubeconfig",
            str(users["operator-person"]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "port-forward did not say it was listening"
        assert b"Forwarding from" in proc.stdout.readline()  # type: ignore[union-attr]

        def fetch(_: int) -> bytes:
            url = f"http://127.0.0.1:{local}/index.html"
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=10) as response:
                        return bytes(response.read())
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        with ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(fetch, range(4)))
        assert bodies == [b"hello-through-the-gateway\n"] * 4
    finally:
        proc.kill()
        proc.wait(10)
    delete_sandbox(kube, tenant, "web")


def test_a_user_past_the_session_cap_is_refused_by_name(
    kube: client.ApiClient,
    agent: Agent,
    gateway: GatewayParts,
    places: tuple[str, str],
    users: dict[str, Path],
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "capped", "while true; do echo tick; sleep 1; done")
    sessions = gateway.gateway.sessions
    before = sessions.per_user
    sessions.per_user = 2
    follow = [
        "sandlot.cli.main", "logs", "capped", "-n", tenant, "-f",
        "--kubeconfig", str(users["operator-person"]),
    ]  # fmt: skip
    held = []
    try:
        for _ in range(2):
            held.append(
                subprocess.Popen(
                    [sys.executable, "-m", *follow],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                )
            )
        for proc in held:  # each is streaming: its first line came
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready and proc.stdout.readline() == b"tick\n"  # type: ignore[union-attr]
        assert sessions.open == 2
        third = sandlot("logs", "capped", "-n", tenant, kubeconfig=users["operator-person"])
        assert third.returncode == 1
        assert "(429)" in third.stderr and "max_sessions_per_user" in third.stderr, third.stderr
    finally:
        sessions.per_user = before
        for proc in held:
            proc.kill()
            proc.wait(10)
    wait_for(lambda: sessions.open == 0, timeout=20, what="the held streams to be given back")
    delete_sandbox(kube, tenant, "capped")
