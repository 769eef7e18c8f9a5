"""Started is not ready, claimed against the real API server and a private containerd.

A sandbox whose exec probe (``test -f /tmp/ready``) fails stays ``Ready=False``
through several probes, then turns ``Ready=True`` once the test itself creates
the file in it; a sandbox whose port nobody listens on stays not ready until the
test starts busybox's httpd in it, then the tcpSocket and httpGet probes pass,
whether or not the agent sees the node's PIDs; a paused sandbox is not probed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd.execs import open_execs
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.containerd import PrivateContainerd
from tests.support import agents
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]
pytest_plugins = ["tests.support.procview"]

IMAGE = "docker.io/sandlot/readiness-busybox:test"
FAST = {"periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 1}
WAIT = 30.0


@pytest.fixture
def agent(started_agent: Agent) -> Agent:
    return started_agent


def _sandbox(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    objs: Any = client.CustomObjectsApi(kube)
    found: dict[str, Any] = objs.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )
    return found


def _ready(sb: dict[str, Any]) -> dict[str, Any] | None:
    for c in (sb.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return dict(c)
    return None


def _wait_ready(kube: client.ApiClient, namespace: str, name: str, status: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = _sandbox(kube, namespace, name)
        assert (sb.get("status") or {}).get("phase") in ("Scheduled", "Running"), sb["status"]
        condition = _ready(sb)
        return condition if condition is not None and condition["status"] == status else None

    return wait_for(probe, timeout=WAIT, what=f"sandbox {name} to be Ready={status}")


def _probes(agent: Agent, handler: str, result: str) -> float:
    value = agent.registry.get_sample_value(
        "sandlot_agent_readiness_probes_total", {"handler": handler, "result": result}
    )
    return value or 0.0


def _passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_readiness_passes_total") or 0.0


def _wait_probes(agent: Agent, handler: str, result: str, more_than: float) -> None:
    wait_for(
        lambda: _probes(agent, handler, result) > more_than,
        timeout=WAIT,
        what=f"more than {more_than:g} {handler} probes with {result}",
    )


def _exec_in(agent: Agent, sb: dict[str, Any], *argv: str) -> int:
    """Run ``argv`` in the sandbox as a user's exec would, bounded; its exit code."""
    settings = agent.settings
    execs = open_execs(
        settings.containerd_address,
        settings.containerd_namespace,
        str(Path(settings.state_dir) / "test-exec"),
    )
    container = sb["status"]["containerId"]
    exec_id = f"test-{uuid.uuid4().hex[:8]}"
    try:
        process = execs.start(container, exec_id, list(argv), tty=False, stdin=False, timeout=10)
        try:
            return execs.wait(process, timeout=10)
        finally:
            process.release()
            execs.delete(container, exec_id, timeout=10)
    finally:
        execs.close()


Start = Callable[..., dict[str, Any]]


@pytest.fixture
def running(kube: client.ApiClient, namespace: str, agent: Agent) -> Start:
    return _starter(kube, namespace, agent)


@pytest.fixture(params=["node-pids", "own-pid-namespace"])
def port_agent(
    request: pytest.FixtureRequest,
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    busybox_archive: Path,
    tmp_path: Path,
) -> Iterator[Agent]:
    """An agent that sees the node's PIDs, and one that sees a PID namespace of its
    own, as on the chart's default install (no ``hostPID``, no ``agent.hostProc``):
    there the task's pid names nothing, or another process."""
    if request.param == "node-pids":
        yield request.getfixturevalue("started_agent")
        return
    proc_root = request.getfixturevalue("own_pid_proc")
    with contextlib.ExitStack() as stack:
        yield agents.start_agent(
            stack,
            kube,
            namespace,
            containerd,
            busybox_archive,
            tmp_path / "logs",
            "ready-own",
            proc_root=proc_root,
        )


def _starter(kube: client.ApiClient, namespace: str, agent: Agent) -> Start:
    def start(name: str, probe: dict[str, Any], **spec: Any) -> dict[str, Any]:
        body = {"image": IMAGE, "command": ["sleep", "300"], "readinessProbe": probe, **spec}
        agents.schedule_sandbox(kube, namespace, name, agent.node, body)

        def is_running() -> dict[str, Any] | None:
            sb = _sandbox(kube, namespace, name)
            phase = (sb.get("status") or {}).get("phase")
            assert phase in ("Scheduled", "Running"), sb.get("status")
            return sb if phase == "Running" else None

        return wait_for(is_running, timeout=WAIT, what=f"sandbox {name} to run")

    return start


def test_an_exec_probe_keeps_a_sandbox_not_ready_until_its_file_exists(
    kube: client.ApiClient, namespace: str, agent: Agent, running: Start
) -> None:
    sb = running("warming", {"exec": {"command": ["sh", "-c", "test -f /tmp/ready"]}, **FAST})
    assert _ready(sb) is None, "Running is not Ready: no verdict before a probe"
    failed = _wait_ready(kube, namespace, "warming", "False")
    assert failed["reason"] == "ProbeFailed" and "exited 1" in failed["message"], failed
    # It stays not ready while the probe keeps running (and failing).
    seen = _probes(agent, "exec", "failure")
    _wait_probes(agent, "exec", "failure", seen + 2)
    still = _ready(_sandbox(kube, namespace, "warming"))
    assert still == failed, "a failure on a not-ready sandbox is no transition: nothing written"

    assert _exec_in(agent, sb, "sh", "-c", "mkdir -p /tmp && touch /tmp/ready") == 0
    passed = _wait_ready(kube, namespace, "warming", "True")
    assert passed["reason"] == "ProbePassed", passed
    assert passed["lastTransitionTime"] >= failed["lastTransitionTime"]


@pytest.mark.parametrize(
    "handler",
    [{"tcpSocket": {"port": 8080}}, {"httpGet": {"path": "/index.html", "port": 8080}}],
    ids=["tcpSocket", "httpGet"],
)
def test_a_port_probe_passes_once_something_listens_inside_the_sandbox(
    kube: client.ApiClient, namespace: str, port_agent: Agent, handler: dict[str, Any]
) -> None:
    agent = port_agent
    name = next(iter(handler)).lower()
    sb = _starter(kube, namespace, agent)(name, {**handler, **FAST})
    failed = _wait_ready(kube, namespace, name, "False")
    assert failed["reason"] == "ProbeFailed", failed
    # With the node's PIDs the agent enters the task's namespace itself (its pid
    # shown to be the task); without, the image's nc or wget probe from inside.
    from_inside = agent.settings.proc_root != "/proc"
    assert ("exec '" in failed["message"]) is from_inside, failed
    # Only on the sandbox's own loopback: the node's 127.0.0.1:8080 is not it.
    serve = "mkdir -p /www && echo ok > /www/index.html && httpd -p 127.0.0.1:8080 -h /www"
    assert _exec_in(agent, sb, "sh", "-c", serve) == 0
    passed = _wait_ready(kube, namespace, name, "True")
    assert passed["reason"] == "ProbePassed", passed


def test_a_paused_sandbox_is_not_probed(
    kube: client.ApiClient, namespace: str, agent: Agent, running: Start
) -> None:
    running("frozen", {"exec": {"command": ["sh", "-c", "true"]}, **FAST}, operatingMode="Paused")

    def paused() -> bool:
        conditions = (_sandbox(kube, namespace, "frozen").get("status") or {}).get("conditions")
        return any(c["type"] == "Paused" and c["status"] == "True" for c in conditions or ())

    wait_for(paused, timeout=WAIT, what="sandbox frozen to be paused")
    passes = _passes(agent)
    wait_for(lambda: _passes(agent) > passes + 3, timeout=WAIT, what="the prober's passes")
    assert _probes(agent, "exec", "success") == 0 and _probes(agent, "exec", "failure") == 0
    assert _ready(_sandbox(kube, namespace, "frozen")) is None
