"""``sandlot cp`` reaches exactly the sandbox's own files, with the sandbox's own
identity, whatever the agent's view of the node's processes: end to end through
the CLI, the real API server, the gateway, the agent and a real containerd.

The chart's default install runs the agent without the node's PIDs (``hostPID:
false``, ``agent.hostProc: false``): there ``/proc/<task pid>`` names nothing, or
another process. The agent here sees a ``/proc`` of a PID namespace of its own, as
that pod does; a second agent sees the node's (``hostProc``). Played as the tenant:
read the kernel's addresses and log, write where the sandbox's user may not, and
find the agent's files at the sandbox's paths.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from tests.support.streams import StartStreamAgent, delete_sandbox, running_sandbox, sandlot
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]
pytest_plugins = ["tests.support.procview"]

TENANT_USER = {"runAsUser": 1000, "runAsGroup": 1000}


@pytest.fixture(scope="module")
def agents(start_stream_agent: StartStreamAgent, own_pid_proc: str) -> dict[str, Agent]:
    return {
        "own-pid-namespace": start_stream_agent("reach-own", proc_root=own_pid_proc),
        "node-proc": start_stream_agent("reach-node"),
    }


def _exec(name: str, tenant: str, kubeconfig: Path, *argv: str) -> str:
    done = sandlot("exec", name, "-n", tenant, "--", *argv, kubeconfig=kubeconfig)
    assert done.returncode == 0, done
    return done.stdout


def test_cp_reaches_the_sandboxs_own_files_as_its_user_without_the_nodes_pids(
    kube: client.ApiClient,
    agents: dict[str, Agent],
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    kubeconfig = users["operator-person"]
    # The same path in the agent's own root and in the sandbox's, with other bytes.
    marker = Path(f"/tmp/sandlot-reach-{uuid.uuid4().hex[:8]}")
    marker.write_text("the agent's own file\n")
    try:
        running_sandbox(
            kube,
            agents["own-pid-namespace"],
            tenant,
            "reach",
            f"echo the sandbox\\'s file > {marker}; sleep 1000",
            spec={"securityContext": TENANT_USER},
        )
        wait_for(
            lambda: "sandbox" in _exec("reach", tenant, kubeconfig, "cat", str(marker)),
            timeout=20,
            what="the sandbox's marker file",
        )
        out = tmp_path / "out"
        got = sandlot("cp", f"reach:{marker}", str(out), "-n", tenant, kubeconfig=kubeconfig)
        assert got.returncode == 0, got.stderr
        assert out.read_text() == "the sandbox's file\n"

        payload = tmp_path / "payload"
        payload.write_bytes(b"written by cp\n")
        inside = f"/tmp/in-{uuid.uuid4().hex[:8]}"
        put = sandlot("cp", str(payload), f"reach:{inside}", "-n", tenant, kubeconfig=kubeconfig)
        assert put.returncode == 0, put.stderr
        assert _exec("reach", tenant, kubeconfig, "cat", inside) == "written by cp\n"
        owner = _exec("reach", tenant, kubeconfig, "ls", "-ln", inside).split()[2:4]
        assert owner == ["1000", "1000"], "a file written is the sandbox's user's"
        assert not Path(inside).exists(), "nothing is written in the agent's root"
        assert marker.read_text() == "the agent's own file\n"

        # The sandbox's user may not write in its root-owned /bin: nor may cp.
        planted = sandlot(
            "cp", str(payload), "reach:/bin/planted", "-n", tenant, kubeconfig=kubeconfig
        )
        assert planted.returncode == 1, planted
        assert "permission denied" in planted.stderr, planted.stderr
        assert "planted" not in _exec("reach", tenant, kubeconfig, "ls", "-a", "/bin")
        delete_sandbox(kube, tenant, "reach")
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("view", ["own-pid-namespace", "node-proc"])
def test_cp_reads_no_kernel_addresses_and_no_kernel_log(
    kube: client.ApiClient,
    agents: dict[str, Agent],
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
    view: str,
) -> None:
    """The sandbox runs as root, as images do by default: the file mode of
    ``/proc/kmsg`` lets it open it, only the missing CAP_SYSLOG refuses it."""
    _, tenant = places
    kubeconfig = users["operator-person"]
    name = f"kernel-{view}"
    running_sandbox(kube, agents[view], tenant, name, "sleep 1000")
    symbols = tmp_path / "kallsyms"
    got = sandlot("cp", f"{name}:/proc/kallsyms", str(symbols), "-n", tenant, kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    lines = symbols.read_text().splitlines()
    assert len(lines) > 1000, "the symbols themselves are read"
    addresses = {line.split(" ", 1)[0] for line in lines}
    assert addresses == {"0" * 16}, f"kernel addresses leaked: {sorted(addresses)[:3]}"

    log = tmp_path / "kmsg"
    kmsg = sandlot("cp", f"{name}:/proc/kmsg", str(log), "-n", tenant, kubeconfig=kubeconfig)
    assert kmsg.returncode == 1, kmsg
    assert "permission denied" in kmsg.stderr, kmsg.stderr
    assert not log.exists() or log.read_bytes() == b""
    delete_sandbox(kube, tenant, name)


def test_cp_reaches_a_sandbox_in_a_user_namespace_of_its_own(
    kube: client.ApiClient,
    agents: dict[str, Agent],
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    """runc mounts the tool into a sandbox whose root is an unprivileged user of the
    node; what the tool writes is that sandbox's root's (0 inside)."""
    _, tenant = places
    kubeconfig = users["operator-person"]
    running_sandbox(
        kube, agents["own-pid-namespace"], tenant, "userns", "sleep 1000", {"hostUsers": False}
    )
    payload = tmp_path / "payload"
    payload.write_bytes(b"into a user namespace\n")
    put = sandlot("cp", str(payload), "userns:/tmp/in", "-n", tenant, kubeconfig=kubeconfig)
    assert put.returncode == 0, put.stderr
    assert _exec("userns", tenant, kubeconfig, "cat", "/tmp/in") == "into a user namespace\n"
    assert _exec("userns", tenant, kubeconfig, "ls", "-ln", "/tmp/in").split()[2:4] == ["0", "0"]
    back = tmp_path / "back"
    got = sandlot("cp", "userns:/tmp/in", str(back), "-n", tenant, kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    assert back.read_bytes() == b"into a user namespace\n"
    delete_sandbox(kube, tenant, "userns")
