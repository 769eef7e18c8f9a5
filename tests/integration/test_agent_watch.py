"""The agent learns of its sandboxes by watch, not by listing: against the real API
server and a private containerd.

Requests are counted on the agent's own ApiClient (a ``RequestCounter`` that also
tells a watch from a LIST), by the resource each addresses. An idle node must cost
the API server nothing beyond its Lease renewals, while passes still run (every
``resync_interval``, from memory) and a change still reaches the node promptly.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.kube import RequestCounter, load_api_client, resource_of
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

IMAGE = "docker.io/sandlot/watch-busybox:test"
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']
WATCHED = ("sandboxes", "sandboxnodes", "cacheprunes", "sandboxsnapshots")


# Beside agent_settings: a slower heartbeat and graceful stop, the reaper at its default.
AGENT_DEFAULTS: dict[str, Any] = {
    "stop_grace": "1s",
    "renew_interval": "2s",
    "reap_interval": AgentSettings.model_fields["reap_interval"].default,
}


AgentFactory = Callable[..., Agent]


@pytest.fixture
def start_agent(
    containerd: PrivateContainerd, ctr_ns: str, tmp_path: Path
) -> Iterator[AgentFactory]:
    with agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs", **AGENT_DEFAULTS) as fleet:
        yield fleet.start


def _objs(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def create_sandbox(api: client.ApiClient, namespace: str, name: str, node: str) -> None:
    agents.schedule_sandbox(api, namespace, name, node, {"image": IMAGE, "command": SLEEPER})


def phase_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    sb = _objs(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)
    return sb.get("status") or {}


def wait_running(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return wait_for(
        lambda: (s := phase_of(api, namespace, name)) and s.get("phase") == "Running" and s,
        timeout=30,
        what=f"sandbox {namespace}/{name} Running",
    )


def container_ids(address: str, ns: str) -> set[str]:
    rt = ContainerdRuntime(address, ns)
    try:
        return {c.id for c in rt.list_containers(timeout=5)}
    finally:
        rt.close()


class WatchAwareCounter(RequestCounter):
    """Requests by (resource, kind): ``watch`` for a watch, else the HTTP verb."""

    def __init__(self) -> None:
        super().__init__()
        self._kinds_lock = threading.Lock()
        self.kinds: Counter[tuple[str, str]] = Counter()

    def record(self, method: str, url: str) -> None:
        super().record(method, url)
        query = url.partition("?")[2].lower()
        kind = "watch" if "watch=true" in query else method.upper()
        with self._kinds_lock:
            self.kinds[(resource_of(url), kind)] += 1

    def by_kind(self) -> Counter[tuple[str, str]]:
        with self._kinds_lock:
            return Counter(self.kinds)


def list_containers_calls(agent: Agent) -> float:
    value = agent.registry.get_sample_value(
        "sandlot_agent_containerd_call_seconds_count", {"method": "list_containers"}
    )
    return value or 0.0


def test_idle_agent_asks_the_api_server_only_for_its_lease_and_still_starts_new_sandboxes(
    control_plane: ControlPlane,
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    start_agent: AgentFactory,
) -> None:
    """With a 1 s resync, at least four full passes run while the agent sends no
    request about Sandboxes, its SandboxNode or CachePrunes but, at most, the
    opening of a watch it had not opened yet (the old pass listed Sandboxes, read
    the node and listed CachePrunes every sync_interval). A Sandbox created
    afterwards still goes Running, woken by its watch event."""
    counter = WatchAwareCounter()
    api = load_api_client(str(control_plane.kubeconfig), counter=counter)
    node = f"node-{uuid.uuid4().hex[:8]}"
    try:
        agent = start_agent(api, namespace, node, resync_interval="1s")
        create_sandbox(kube, namespace, "first", node)
        wait_running(kube, namespace, "first")

        # Idle from here: the start's own status write has come back by its event.
        wait_for(
            lambda: (
                (agent.sandbox_watch.get(f"{namespace}/first") or {}).get("status", {}).get("phase")
                == "Running"
            ),
            timeout=10,
            what="the agent's watch to show its own Running write",
        )
        before, passes_before = counter.by_kind(), list_containers_calls(agent)
        wait_for(
            lambda: list_containers_calls(agent) >= passes_before + 4,
            timeout=15,
            what="four resync passes of an idle agent",
        )
        asked = counter.by_kind() - before
        reads = {key: n for key, n in asked.items() if key[0] in WATCHED and key[1] != "watch"}
        assert not reads, f"an idle agent read its watched objects: {dict(asked)}"
        watches = {key: n for key, n in asked.items() if key[1] == "watch"}
        assert all(n <= 1 for n in watches.values()), f"watches reopened: {dict(asked)}"
        assert {r for r, _ in asked} - set(WATCHED) <= {"leases"}, dict(asked)

        create_sandbox(kube, namespace, "second", node)
        status = wait_running(kube, namespace, "second")
        assert status["containerId"] in container_ids(containerd.address, ctr_ns)
    finally:
        api.close()


def test_sandbox_marked_dead_while_running_is_torn_down_from_its_event(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    start_agent: AgentFactory,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    agent = start_agent(kube, namespace, node)
    create_sandbox(kube, namespace, "fenced", node)
    container = wait_running(kube, namespace, "fenced")["containerId"]
    _objs(kube).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        "fenced",
        {"status": {"phase": "Dead", "reason": "NodeLost", "message": "test"}},
    )
    wait_for(
        lambda: container not in container_ids(containerd.address, ctr_ns),
        timeout=20,
        what=f"container {container} of the Dead sandbox torn down",
    )
    assert (phase_of(kube, namespace, "fenced") or {}).get("phase") == "Dead"
    assert agent.registry.get_sample_value("sandlot_agent_fenced_total") == 1.0


def test_watch_broken_by_an_api_server_restart_lists_again_and_sees_what_changed(
    own_plane: ControlPlane,
    containerd: PrivateContainerd,
    ctr_ns: str,
    start_agent: AgentFactory,
) -> None:
    """The watches break when the API server goes; the agent lists again once it is
    back, and both a deletion and a new Sandbox made after the restart reach it."""
    api = load_api_client(str(own_plane.kubeconfig))
    node = f"node-{uuid.uuid4().hex[:8]}"
    try:
        agent = start_agent(api, "sandlot-system", node)
        create_sandbox(api, "work", "old", node)
        old = wait_running(api, "work", "old")["containerId"]
        lists = agent.sandbox_watch.lists

        own_plane.stop_apiserver()
        own_plane.restart_apiserver()
        wait_for(
            lambda: agent.sandbox_watch.lists > lists,
            timeout=60,
            what="the sandbox watch to list again after the API server restart",
        )
        _objs(api).delete_namespaced_custom_object(GROUP, VERSION, "work", "sandboxes", "old")
        create_sandbox(api, "work", "new", node)
        new = wait_running(api, "work", "new")["containerId"]
        wait_for(
            lambda: old not in container_ids(containerd.address, ctr_ns),
            timeout=30,
            what=f"container {old} of the deleted sandbox stopped",
        )
        assert new in container_ids(containerd.address, ctr_ns)
    finally:
        api.close()
