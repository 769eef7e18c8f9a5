"""Faults under a real agent: a frozen API server whose connections died silently,
and an agent process killed with SIGKILL and restarted within the grace period.

Each runs on a control plane of its own (the API server is frozen or the operator
judges the node) and a real containerd; every wait is bounded and says what for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.kube import load_api_client
from sandlot.adapters.sandboxwatch import liveness_bound
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import parse_time
from sandlot.devtools.containerd import PrivateContainerd
from sandlot.devtools.controlplane import ControlPlane
from tests.support import agents
from tests.support.agents import agent_settings
from tests.support.netfault import SeveringRelay, relayed_kubeconfig
from tests.support.operator import OperatorProcess
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/agent-faults-busybox:1"
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']
NS = "work"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


@pytest.fixture
def ctr_ns(containerd: PrivateContainerd, archive: Path) -> Iterator[str]:
    with agents.containerd_namespace(containerd, "faults", archive) as ns:
        yield ns


def _create(objs: Any, name: str, node: str) -> None:
    spec = {"image": IMAGE, "command": SLEEPER}
    agents.schedule_sandbox(objs.api_client, NS, name, node, spec)


def _status(objs: Any, name: str) -> dict[str, Any]:
    sb = objs.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", name)
    return dict(sb.get("status") or {})


def _running(objs: Any, name: str, timeout: float) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = _status(objs, name)
        return status if status.get("phase") == "Running" else None

    return wait_for(probe, timeout=timeout, what=f"sandbox {name} Running")


def _task_pids(rt: ContainerdRuntime, container_ids: list[str]) -> dict[str, int | None]:
    pids: dict[str, int | None] = {}
    for cid in container_ids:
        task = rt.get_task(cid, timeout=5)
        pids[cid] = task.pid if task is not None else None
    return pids


# ---------------------------------------------------------------- silent watch death

WATCH_TIMEOUT = 3


def test_watch_that_died_silently_is_replaced_below_the_reap_horizon(
    own_plane: ControlPlane,
    containerd: PrivateContainerd,
    ctr_ns: str,
    tmp_path: Path,
) -> None:
    """The API server is frozen (SIGSTOP) for longer than the watch bound, and every
    connection the agent had open dies silently meanwhile: the agent's view must be
    listed again within the bound, not at a read timeout of minutes."""
    relay = SeveringRelay(own_plane.apiserver_port).start()
    via_relay = tmp_path / "relay-kubeconfig"
    relayed_kubeconfig(own_plane, relay, via_relay)
    agent_api = load_api_client(str(via_relay))
    test_api = load_api_client(str(own_plane.kubeconfig))
    objs: Any = client.CustomObjectsApi(test_api)
    node = f"node-{uuid.uuid4().hex[:6]}"
    settings = agent_settings(
        node=node,
        namespace="sandlot-system",
        containerd=containerd,
        ctr_ns=ctr_ns,
        log_dir=tmp_path / "logs",
        watch_timeout=f"{WATCH_TIMEOUT}s",
    )
    agent = Agent(settings, agent_api, registry=CollectorRegistry())
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    apiserver = own_plane.pids()["kube-apiserver"]
    bound = liveness_bound(WATCH_TIMEOUT)
    try:
        assert agent.start()
        _create(objs, "before", node)
        before = _running(objs, "before", timeout=30)
        lists_before = agent.sandbox_watch.lists

        os.kill(apiserver, signal.SIGSTOP)
        try:
            relay.sever_silently()  # what the agent had open is now a black hole
            time.sleep(bound + 2)  # the freeze outlasts the bound
        finally:
            os.kill(apiserver, signal.SIGCONT)

        _create(objs, "after", node)
        # A fresh LIST (bound), a request or two that find a dead pooled connection
        # first (the client's 30 s read timeout each), then the start itself.
        try:
            _running(objs, "after", timeout=bound + 75)
        except AssertionError as exc:
            raise AssertionError(
                f"a Sandbox created after the freeze was not started: the agent's watch "
                f"still hangs on a dead connection ({exc})"
            ) from None
        assert agent.sandbox_watch.lists > lists_before, "the view was never listed again"
        now = _status(objs, "before")
        assert now.get("phase") == "Running", f"the sandbox from before left Running: {now}"
        pids = _task_pids(rt, [before["containerId"]])
        assert pids[before["containerId"]] == before["pid"], "the running container was torn down"
    finally:
        agent.shutdown()
        rt.close()
        relay.close()
        agent_api.close()
        test_api.close()


# ---------------------------------------------------------------- agent SIGKILL


class AgentProcess:
    """``sandlot agent`` as a process of its own (the DaemonSet's pod, minus the pod)."""

    def __init__(self, workdir: Path, args: list[str], generation: int) -> None:
        self.log_path = workdir / f"agent-{generation}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandlot.cli.main", "agent", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _agent_args(
    plane: ControlPlane, containerd: PrivateContainerd, ctr_ns: str, node: str, workdir: Path
) -> list[str]:
    """Flags of a ``sandlot agent`` with a 3 s lease and short bounds."""
    return [
        "--kubeconfig", str(plane.kubeconfig),
        "--node-name", node,
        "--namespace", "sandlot-system",
        "--containerd-address", containerd.address,
        "--containerd-namespace", ctr_ns,
        "--containerd-root", str(containerd.root),
        "--lease-duration", "3s",
        "--renew-interval", "1s",
        "--sync-interval", "0.3s",
        "--reap-interval", "1s",
        "--kill-wait", "2s",
        "--call-timeout", "2s",
        "--metrics-port", "0",
        "--node-address", "10.1.2.3",
        "--log-dir", str(workdir / "logs"),
        "--network-mode", "host-address",  # whatever the host's /etc/cni/net.d holds
    ]  # fmt: skip


GRACE = 20


def test_agent_killed_and_restarted_within_grace_keeps_every_sandbox(
    own_plane: ControlPlane,
    containerd: PrivateContainerd,
    ctr_ns: str,
    tmp_path: Path,
) -> None:
    api = load_api_client(str(own_plane.kubeconfig))
    objs: Any = client.CustomObjectsApi(api)
    node = f"node-{uuid.uuid4().hex[:6]}"
    args = _agent_args(own_plane, containerd, ctr_ns, node, tmp_path)
    op = OperatorProcess(
        own_plane, tmp_path, "sandlot-system",
        "--grace-period", f"{GRACE}s",
        "--resync-interval", "1s",
        "--agent-lease-duration", "3s",
        "--lease-view-max-age", "10s",
    )  # fmt: skip
    first = AgentProcess(tmp_path, args, 1)
    second: AgentProcess | None = None
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    names = [f"keep{i}" for i in range(3)]

    def node_phase() -> str | None:
        try:
            got = objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)
        except client.ApiException:
            return None
        return (got.get("status") or {}).get("phase")

    try:
        op.wait_metrics()
        wait_for(lambda: node_phase() == "Ready", timeout=60, what=f"node {node} Ready")
        for name in names:
            _create(objs, name, node)
        running = {n: _running(objs, n, timeout=60) for n in names}
        ids = [running[n]["containerId"] for n in names]
        pids_before = _task_pids(rt, ids)
        assert all(pids_before.values()), f"a task is missing before the kill: {pids_before}"

        first.kill()
        # The operator sees the lease expire: the grace period has begun.
        wait_for(lambda: node_phase() == "NotReady", timeout=30, what=f"node {node} NotReady")
        unhealthy = objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)
        since = parse_time(
            ((unhealthy.get("status") or {}).get("health") or {}).get("unhealthySince")
        )
        assert since is not None, f"no grace period recorded: {unhealthy.get('status')}"

        second = AgentProcess(tmp_path, args, 2)
        wait_for(lambda: node_phase() == "Ready", timeout=GRACE, what=f"node {node} Ready again")
        assert datetime.now(UTC) < since + timedelta(seconds=GRACE), (
            "the agent came back only after the grace period: the test proves nothing"
        )
        # Outlive the grace that began with the kill: nothing may be marked for it.
        end = since + timedelta(seconds=GRACE + 3)
        time.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()))

        phases = {n: _status(objs, n).get("phase") for n in names}
        assert phases == dict.fromkeys(names, "Running"), (
            f"sandboxes left Running across an agent SIGKILL: {phases}\n{op.log()}"
        )
        pids_after = _task_pids(rt, ids)
        assert pids_after == pids_before, (
            f"containers were restarted or torn down: {pids_before} -> {pids_after}\n{second.log()}"
        )
        assert {n: _status(objs, n).get("pid") for n in names} == {
            n: running[n]["pid"] for n in names
        }
        assert second.proc.poll() is None, f"the restarted agent died:\n{second.log()}"
    finally:
        if first.proc.poll() is None:
            first.kill()
        if second is not None:
            second.stop()
        op.stop()
        rt.close()
        api.close()
