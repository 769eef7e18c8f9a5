"""The three programs start as data: each declares its parts in one order, which
``docs/architecture.md`` shows as it is; the threaded programs' parts start in that
order and stop in reverse (``adapters.startorder.StartedParts``); and the agent's
parts are built whole, meeting where they meet through ``agent.uses``, never
finished by an assignment after they were built."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.startorder import StartedParts, ThreadPart
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.devtools.certs import StreamCerts
from sandlot.gateway.runner import GatewayParts, process_parts
from tests.support.agent import FakeRuntime

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
AGENT = ROOT / "operator" / "sandlot" / "agent"


def documented_orders() -> dict[str, list[str]]:
    """The lists under "The three start-up orders": program -> part names."""
    orders: dict[str, list[str]] = {}
    for line in DOC.read_text().splitlines():
        found = re.match(r"- \*\*(operator|agent|gateway)\*\* \(`[\w.]+`\): (.+)$", line)
        if found:
            orders[found[1]] = re.findall(r"`([\w-]+)`", found[2])
    assert set(orders) == {"operator", "agent", "gateway"}, f"lists found: {orders}"
    return orders


def unreachable_api() -> client.ApiClient:
    """A client nothing here calls before a part that talks to the API starts."""
    configuration = client.Configuration()
    configuration.host = "https://127.0.0.1:1"
    return client.ApiClient(configuration)


def agent_settings(tmp_path: Path, **more: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "node_name": "n1",
        "namespace": "sandlot-system",
        "metrics_port": 0,
        "stream_port": 0,
        "node_address": "10.1.2.3",
        "state_dir": str(tmp_path / "state"),
        "log_dir": str(tmp_path / "logs"),
        "containerd_root": str(tmp_path / "root"),
        "containerd_config": str(tmp_path / "config.toml"),
        "cgroup_root": str(tmp_path / "cgroup"),
    }
    return AgentSettings(**{**values, **more})


def make_agent(tmp_path: Path, rt: FakeRuntime, **more: Any) -> Agent:
    return Agent(
        agent_settings(tmp_path, **more),
        unreachable_api(),
        runtime_factory=lambda: rt,
        registry=CollectorRegistry(),
    )


# -- the documented orders are the declared ones


def test_the_operator_order_in_the_docs_is_the_one_it_declares(tmp_path: Path) -> None:
    from sandlot.controllers import operator
    from sandlot.controllers.settings import OperatorSettings

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )

    async def names() -> list[str]:
        parts = operator.build_parts(
            OperatorSettings(), kubeconfig=str(kubeconfig), registry=CollectorRegistry()
        )
        try:
            return [p.name for p in parts.in_order()]
        finally:
            parts.events.close()
            parts.api.close()
            parts.election_api.close()

    assert asyncio.run(names()) == documented_orders()["operator"]


def test_the_agent_order_in_the_docs_is_the_one_it_declares(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, FakeRuntime())
    assert [p.name for p in agent.in_order()] == documented_orders()["agent"]


def test_the_gateway_order_in_the_docs_is_the_one_it_declares() -> None:
    served = SimpleNamespace(start=lambda: None, shutdown=lambda: None)
    parts = GatewayParts(
        served,  # type: ignore[arg-type]
        SimpleNamespace(),  # type: ignore[arg-type]
        CollectorRegistry(),
        router=served,  # type: ignore[arg-type]
        metrics_port=1,
    )
    declared = [p.name for p in process_parts(SimpleNamespace(close=lambda: None), parts)]
    assert declared == documented_orders()["gateway"]


# -- started in order, stopped in reverse


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def part(self, name: str, *, answer: bool | None = None, fail: bool = False) -> ThreadPart:
        def start() -> bool | None:
            self.calls.append(f"start {name}")
            if fail:
                raise RuntimeError(f"{name} cannot start")
            return answer

        return ThreadPart(name, start, lambda: self.calls.append(f"stop {name}"))


def test_threaded_parts_start_in_order_and_stop_in_reverse_once() -> None:
    rec, started = Recorder(), StartedParts()
    assert started.start([rec.part(n) for n in "abc"])
    assert started.started == ["a", "b", "c"]
    started.close()
    started.close()
    assert rec.calls == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]


def test_a_part_that_did_not_come_up_ends_the_start_up_and_is_not_stopped() -> None:
    rec, started = Recorder(), StartedParts()
    assert not started.start([rec.part("a"), rec.part("b", answer=False), rec.part("c")])
    started.close()
    assert rec.calls == ["start a", "start b", "stop a"]


def test_a_part_that_fails_to_start_stops_those_before_it_then_raises() -> None:
    rec, started = Recorder(), StartedParts()
    with pytest.raises(RuntimeError, match="b cannot start"):
        started.start([rec.part("a"), rec.part("b", fail=True), rec.part("c")])
    assert rec.calls == ["start a", "start b", "stop a"]
    started.close()
    assert rec.calls == ["start a", "start b", "stop a"], "stopped once"


def test_part_names_are_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        StartedParts().start([ThreadPart("a"), ThreadPart("a")])


def test_the_agent_stops_the_parts_it_started_in_reverse(tmp_path: Path) -> None:
    """Up to containerd and the parts over it, with a fake runtime: shutdown undoes
    them newest first (the runtime closed before the node lock is let go)."""
    rt = FakeRuntime()
    agent = make_agent(tmp_path, rt)
    events: list[str] = []
    closing = rt.close

    def close() -> None:
        events.append("runtime closed")
        closing()

    rt.close = close  # type: ignore[method-assign]
    releasing = agent.node_lock.release

    def release() -> None:
        events.append("node lock released")
        releasing()

    agent.node_lock.release = release  # type: ignore[method-assign]
    prefix = agent.in_order()[:4]
    assert [p.name for p in prefix] == ["health", "node-lock", "containerd", "streams"]
    started = StartedParts()
    assert started.start(prefix)
    assert agent.runtime is not None and agent.node_lock.path.exists()
    started.close()
    assert events == ["runtime closed", "node lock released"]


# -- built whole: idle, streams and sync meet through agent.uses


def test_the_agent_parts_are_built_meeting_through_one_interface(tmp_path: Path) -> None:
    certs = StreamCerts.create(tmp_path / "certs", "sandlot-system")
    rt = FakeRuntime()
    agent = make_agent(
        tmp_path,
        rt,
        stream_port=1,
        stream_tls_cert=str(certs.agent("n1").cert),
        stream_tls_key=str(certs.agent("n1").key),
        stream_client_ca=str(certs.ca.cert),
        paused_streams="Resume",
    )
    started = StartedParts()
    assert started.start(agent.in_order()[:3]), "built over the fake runtime"
    try:
        parts, uses = agent.parts, agent.uses
        streams = parts.streams
        assert streams is not None
        # The stream server: its slots are the shared ones, it thaws through the
        # idle loop and restores through the shared idle suspensions.
        assert streams.uses is uses
        assert streams.wake == parts.idle.wake
        assert streams.restore == uses.suspends.wake_for_use
        assert streams.paused_resume
        # The idle loop: the streams' sessions hold off its pauses, one thaw lock.
        assert parts.idle.sessions == uses.sessions
        assert parts.idle.suspends is uses.suspends
        assert parts.idle._lock is uses.thaws
        # The sync: the streams in use, the idle flags, the thaw lock, the idle hooks.
        assert parts.sync.in_use == uses.in_use
        assert parts.sync.idle_flags == uses.suspends.flags
        assert parts.sync.modes.in_use == uses.in_use
        assert parts.sync.modes.thaws is uses.thaws
        assert parts.sync.suspensions.idle is parts.idle
        assert parts.sync.suspensions.streams is uses
        # The starts: forks from the snapshots, images marked used by the collector.
        assert parts.work.starts.fork_image == parts.snapshots.fork_image
        assert parts.work.starts._touch_image == parts.collector.touch_image
        assert uses.wake_sync == agent._sync_wake.set
    finally:
        started.close()


def _assignments_outside_self(path: Path) -> list[str]:
    """``x.attr = ...`` (and ``setattr``) on anything but ``self``'s own attributes."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        flat: list[ast.expr] = []
        for target in targets:
            flat.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        for target in flat:
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                continue
            found.append(f"{path.name}:{getattr(node, 'lineno', '?')} {ast.unparse(target)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
            found.append(f"{path.name}:{getattr(node, 'lineno', '?')} {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "module", ["main.py", "parts.py", "idle.py", "streams.py", "sync.py", "modes.py"]
)
def test_no_part_is_finished_by_an_assignment_after_it_was_built(module: str) -> None:
    assert _assignments_outside_self(AGENT / module) == []
