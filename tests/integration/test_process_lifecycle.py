"""The two programs as real processes: a start-up setting that cannot work is one
line naming it, and SIGTERM ends them cleanly within a few seconds whatever state
they are in, with the API server up or gone."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane, free_port
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

STOP_BOUND = 10.0  # seconds from SIGTERM to exit; the kubelet's grace is 30
START_BOUND = 60.0


def sandlot(*args: str, kubeconfig: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sandlot.cli.main",
        args[0],
        "--kubeconfig",
        str(kubeconfig),
        *args[1:],
    ]


def finish(argv: list[str], timeout: float = START_BOUND) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode != 0, f"exited 0:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("sandlot: error:")]
    assert len(errors) == 1, done.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def agent_argv(kubeconfig: Path, namespace: str, *extra: str) -> list[str]:
    return sandlot(
        "agent",
        "--node",
        f"node-{uuid.uuid4().hex[:6]}",
        "--namespace",
        namespace,
        "--node-address",
        "10.9.8.7",
        "--renew-interval",
        "1s",
        *extra,
        kubeconfig=kubeconfig,
    )


def operator_argv(kubeconfig: Path, namespace: str, *extra: str) -> list[str]:
    return sandlot(
        "operator",
        "--namespace",
        namespace,
        "--identity",
        f"op-{uuid.uuid4().hex[:6]}",
        *extra,
        kubeconfig=kubeconfig,
    )


# --------------------------------------------------------------- start-up errors


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("program", ["operator", "agent"])
def test_busy_metrics_port_is_one_line_naming_the_flag_and_the_port(
    control_plane: ControlPlane, namespace: str, busy_port: int, program: str
) -> None:
    make = operator_argv if program == "operator" else agent_argv
    done = finish(make(control_plane.kubeconfig, namespace, "--metrics-port", str(busy_port)))
    line = assert_one_line_error(done, "--metrics-port", "SANDLOT_METRICS_PORT", str(busy_port))
    assert "already in use" in line


@pytest.mark.parametrize("program", ["operator", "agent"])
def test_missing_namespace_is_one_line_naming_it_and_the_setting(
    control_plane: ControlPlane, program: str
) -> None:
    missing = f"nowhere-{uuid.uuid4().hex[:6]}"
    make = operator_argv if program == "operator" else agent_argv
    done = finish(make(control_plane.kubeconfig, missing, "--metrics-port", "0"))
    assert_one_line_error(done, repr(missing), "--namespace", "SANDLOT_NAMESPACE")
    assert "HTTP response headers" not in done.stderr


# --------------------------------------------------------------- SIGTERM


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own: the tests stop its API server."""
    plane = ControlPlane(workdir=tmp_path_factory.mktemp("stop-plane"))
    plane.start()
    api = load_api_client(str(plane.kubeconfig))
    apply_crds(api, [crd_for(k) for k in KINDS])
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name="sandlot-system"))
    )
    api.close()
    yield plane
    plane.stop()


@pytest.fixture
def plane(own_plane: ControlPlane) -> Iterator[ControlPlane]:
    yield own_plane
    if "kube-apiserver" not in own_plane.pids():
        own_plane.restart_apiserver()


class Program:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_logged(self, text: str) -> None:
        def seen() -> bool:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.log()}"
            return text in self.log()

        wait_for(seen, timeout=START_BOUND, what=f"the log to say {text!r}", interval=0.2)

    def terminate_within(self, bound: float) -> float:
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(bound)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            log = self.log()[-3000:]
            raise AssertionError(f"still running {bound:.0f}s after SIGTERM:\n{log}") from None
        took = time.monotonic() - began
        self._log.close()
        log = self.log()
        assert code == 0, f"exit code {code} (negative: killed by that signal):\n{log[-3000:]}"
        assert "Fatal Python error" not in log and "Traceback" not in log, log[-3000:]
        return took

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def programs() -> Iterator[list[Program]]:
    started: list[Program] = []
    yield started
    for p in started:
        p.kill()


@pytest.mark.parametrize("api_server", ["up", "gone"])
def test_leading_operator_exits_cleanly_soon_after_sigterm(
    plane: ControlPlane, tmp_path: Path, programs: list[Program], api_server: str
) -> None:
    op = Program(
        operator_argv(plane.kubeconfig, "sandlot-system", "--metrics-port", "0"),
        tmp_path / "operator.log",
    )
    programs.append(op)
    op.wait_logged("is the leader")
    if api_server == "gone":
        plane.stop_apiserver()
        op.wait_logged("leader election: ")  # its loops have met the outage
    took = op.terminate_within(STOP_BOUND)
    print(f"operator, API server {api_server}: exited {took:.1f}s after SIGTERM")


@pytest.mark.parametrize("state", ["waiting-for-containerd", "ready-api-up", "ready-api-gone"])
def test_agent_exits_cleanly_soon_after_sigterm(
    plane: ControlPlane,
    containerd: PrivateContainerd,
    tmp_path: Path,
    programs: list[Program],
    state: str,
) -> None:
    address = (
        f"unix://{tmp_path}/no-containerd.sock"
        if state == "waiting-for-containerd"
        else containerd.address
    )
    agent = Program(
        agent_argv(
            plane.kubeconfig,
            "sandlot-system",
            "--metrics-port",
            str(free_port()),
            "--containerd-address",
            address,
            "--containerd-namespace",
            f"stop-{uuid.uuid4().hex[:6]}",
            "--containerd-root",
            str(containerd.root),
            "--log-dir",
            str(tmp_path / "logs"),
        ),
        tmp_path / "agent.log",
    )
    programs.append(agent)
    agent.wait_logged("unreachable" if state == "waiting-for-containerd" else " ready after ")
    if state == "ready-api-gone":
        plane.stop_apiserver()
        agent.wait_logged("lease renewal failed")  # its loops have met the outage
    took = agent.terminate_within(STOP_BOUND)
    print(f"agent, {state}: exited {took:.1f}s after SIGTERM")
