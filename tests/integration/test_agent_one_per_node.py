"""One agent per node: two real ``sandlot agent`` processes for one node on one real
containerd. The second waits, saying which pid holds the node, and stays not
ready, until the first exits; then it starts."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from sandlot.devtools.controlplane import ControlPlane, free_port
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

from .test_process_lifecycle import STOP_BOUND, Program, agent_argv, own_plane, plane, programs

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

__all__ = ["own_plane", "plane", "programs"]  # fixtures this module shares

WAIT_BOUND = 30.0


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as e:
        if e.code == 503:
            return False
        raise


def test_a_second_agent_of_a_node_waits_saying_who_holds_it_until_the_first_exits(
    plane: ControlPlane,
    containerd: PrivateContainerd,
    tmp_path: Path,
    programs: list[Program],
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    shared = (
        "--node",
        node,
        "--containerd-address",
        containerd.address,
        "--containerd-namespace",
        f"one-{uuid.uuid4().hex[:6]}",
        "--containerd-root",
        str(containerd.root),
        "--log-dir",
        str(tmp_path / "logs"),
        "--state-dir",
        str(tmp_path / "state"),
    )
    ports = free_port(), free_port()

    def agent(i: int) -> Program:
        argv = agent_argv(plane.kubeconfig, "sandlot-system", "--metrics-port", str(ports[i]))
        # agent_argv names a node of its own: the later --node wins.
        program = Program([*argv, *shared], tmp_path / f"agent-{i}.log")
        programs.append(program)
        return program

    first = agent(0)
    first.wait_logged(" ready after ")
    second = agent(1)
    second.wait_logged(f"(pid {first.proc.pid}) holds")
    wait_for(lambda: second.proc.poll() is None, timeout=1, what="the second agent alive")
    assert not ready(ports[1]), "the waiting agent reports ready"
    assert " ready after " not in second.log(), "the second agent started beside the first"
    assert "swept" not in second.log()

    first.terminate_within(STOP_BOUND)
    wait_for(
        lambda: " ready after " in second.log(),
        timeout=WAIT_BOUND,
        what="the second agent to start once the first exited",
        interval=0.2,
    )
    assert "the other agent exited" in second.log()
    wait_for(lambda: ready(ports[1]), timeout=10, what="the second agent ready")
    second.terminate_within(STOP_BOUND)
