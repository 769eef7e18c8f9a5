"""``sandlot cp`` (files and whole directories), ``sandlot port-forward`` and the
stream caps, end to end: the CLI, the real API server, the gateway, the agent and
a real containerd sandbox.

The fixtures are those of ``tests/integration/test_streams.py``
(``tests/support/streams.py``). The abuse is done for real: a symlink to the node's
``/etc/shadow`` and a ``..`` path asked for by name, a tree copied through a link
out of the sandbox, a write past the cap, more streams than a user may hold.
"""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
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
    assert proc.stdout is not None  # PIPE
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "port-forward did not say it was listening"
        assert b"Forwarding from" in proc.stdout.readline()

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
    before = sessions.caps
    sessions.caps = replace(before, per_user=2)
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
            assert proc.stdout is not None  # PIPE
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready and proc.stdout.readline() == b"tick\n"
        assert sessions.open == 2
        third = sandlot("logs", "capped", "-n", tenant, kubeconfig=users["operator-person"])
        assert third.returncode == 1
        assert "(429)" in third.stderr and "max_sessions_per_user" in third.stderr, third.stderr
    finally:
        sessions.caps = before
        for proc in held:
            proc.kill()
            proc.wait(10)
    wait_for(lambda: sessions.open == 0, timeout=20, what="the held streams to be given back")
    delete_sandbox(kube, tenant, "capped")


# -- directories ------------------------------------------------------------------------


def _make_tree(root: Path) -> None:
    """Nested directories, an empty one, small files and a 1 MiB one."""
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.txt").write_text("alpha\n")
    (root / "nested" / "b.txt").write_text("beta\n")
    (root / "nested" / "deeper" / "c with space.txt").write_text("gamma\n")
    (root / "big.bin").write_bytes(os.urandom(MiB))


def _local_manifest(root: Path) -> tuple[set[str], dict[str, str]]:
    """(directories, file -> sha256), relative to ``root``, ``.`` for the root."""
    dirs, files = {"."}, {}
    for path in root.rglob("*"):
        rel = f"./{path.relative_to(root).as_posix()}"
        assert not path.is_symlink(), f"{rel}: a symlink was copied"
        if path.is_dir():
            dirs.add(rel)
        else:
            files[rel] = _digest(path)
    return dirs, files


def _sandbox_manifest(
    name: str, root: str, tenant: str, kubeconfig: Path
) -> tuple[set[str], dict[str, str]]:
    script = f"cd '{root}' && find . -type d && echo --- && find . -type f -exec sha256sum {{}} +"
    seen = sandlot("exec", name, "-n", tenant, "--", "sh", "-c", script, kubeconfig=kubeconfig)
    assert seen.returncode == 0, seen.stderr
    listed, _, summed = seen.stdout.partition("---\n")
    files = {}
    for line in summed.splitlines():
        digest, _, path = line.partition("  ")
        files[path] = digest
    return set(listed.splitlines()), files


def _in_sandbox(name: str, tenant: str, kubeconfig: Path, script: str) -> str:
    done = sandlot("exec", name, "-n", tenant, "--", "sh", "-c", script, kubeconfig=kubeconfig)
    assert done.returncode == 0, (script, done.stderr)
    return done.stdout


def test_cp_copies_a_tree_in_and_out_with_its_structure_and_checksums(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "tree", "sleep 1000")
    kubeconfig = users["operator-person"]
    src = tmp_path / "src"
    _make_tree(src)
    expected = _local_manifest(src)
    assert len(expected[1]) == 4 and "./empty" in expected[0]

    # /tmp/dst does not exist: the copy is made as /tmp/dst.
    up = sandlot("cp", str(src), "tree:/tmp/dst", "-n", tenant, kubeconfig=kubeconfig)
    assert up.returncode == 0, up.stderr
    assert _sandbox_manifest("tree", "/tmp/dst", tenant, kubeconfig) == expected
    modes = _in_sandbox(
        "tree", tenant, kubeconfig, "stat -c '%a %n' /tmp/dst/nested /tmp/dst/empty"
    )
    assert modes.split() == ["755", "/tmp/dst/nested", "755", "/tmp/dst/empty"]

    # Out again, to a path that does not exist, then into a directory that does.
    back = tmp_path / "back"
    down = sandlot("cp", "tree:/tmp/dst", str(back), "-n", tenant, kubeconfig=kubeconfig)
    assert down.returncode == 0, down.stderr
    assert _local_manifest(back) == expected
    into = tmp_path / "into"
    into.mkdir()
    again = sandlot("cp", "tree:/tmp/dst/", str(into), "-n", tenant, kubeconfig=kubeconfig)
    assert again.returncode == 0, again.stderr
    assert _local_manifest(into / "dst") == expected

    # /tmp/dst exists now: a second copy goes into it, under the source's name.
    twice = sandlot("cp", str(src), "tree:/tmp/dst", "-n", tenant, kubeconfig=kubeconfig)
    assert twice.returncode == 0, twice.stderr
    assert _sandbox_manifest("tree", "/tmp/dst/src", tenant, kubeconfig) == expected
    delete_sandbox(kube, tenant, "tree")


def test_cp_out_of_a_sandbox_skips_its_symlinks_and_never_follows_them(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "links", "sleep 1000")
    kubeconfig = users["operator-person"]
    _in_sandbox(
        "links",
        tenant,
        kubeconfig,
        "mkdir -p /tmp/t/sub && echo kept > /tmp/t/sub/f && ln -s /etc /tmp/t/etc && "
        "ln -s /etc/passwd /tmp/t/sub/pw && ln -s sub /tmp/t/relative",
    )
    out = tmp_path / "out"
    got = sandlot("cp", "links:/tmp/t", str(out), "-n", tenant, kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    assert _local_manifest(out)[0] == {".", "./sub"}
    assert (out / "sub" / "f").read_text() == "kept\n"
    assert sorted(p.name for p in out.rglob("*")) == ["f", "sub"]
    for link in ("links:/tmp/t/etc", "links:/tmp/t/sub/pw", "links:/tmp/t/relative"):
        assert f"skipped {link}: a symlink, never followed" in got.stderr, got.stderr
    delete_sandbox(kube, tenant, "links")


def test_cp_of_a_tree_refuses_a_destination_through_a_symlink_out_of_the_sandbox(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "escape-tree", "sleep 1000")
    kubeconfig = users["operator-person"]
    _in_sandbox(
        "escape-tree",
        tenant,
        kubeconfig,
        "ln -s / /tmp/up && ln -s ../../../../.. /tmp/rel && mkdir -p /tmp/clash/src/zz.txt",
    )
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a\n")
    (src / "zz.txt").write_text("z\n")
    marker = f"sandlot-escaped-{uuid.uuid4().hex[:8]}"
    for dest in (f"/tmp/up/{marker}", f"/tmp/rel/{marker}", f"/tmp/up/tmp/{marker}"):
        got = sandlot("cp", str(src), f"escape-tree:{dest}", "-n", tenant, kubeconfig=kubeconfig)
        assert got.returncode == 1, (dest, got)
        assert "outside the sandbox's root" in got.stderr, (dest, got.stderr)
        assert not Path(f"/{marker}").exists() and not Path(f"/tmp/{marker}").exists()
    # The link itself as the destination: there is something there, and not a directory.
    onto = sandlot("cp", str(src), "escape-tree:/tmp/up", "-n", tenant, kubeconfig=kubeconfig)
    assert onto.returncode == 1
    assert "/tmp/up: exists and is not a directory" in onto.stderr, onto.stderr
    # A copy that fails half-way says what it copied and where it stopped.
    half = sandlot("cp", str(src), "escape-tree:/tmp/clash", "-n", tenant, kubeconfig=kubeconfig)
    assert half.returncode == 1
    assert "/tmp/clash/src/zz.txt: is a directory" in half.stderr, half.stderr
    assert (
        "copied 2 of 2 directories and 1 of 2 files (2 bytes) to escape-tree:/tmp/clash/src "
        "before it stopped"
    ) in half.stderr, half.stderr
    assert _in_sandbox("escape-tree", tenant, kubeconfig, "cat /tmp/clash/src/a.txt") == "a\n"
    delete_sandbox(kube, tenant, "escape-tree")
