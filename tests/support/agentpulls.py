"""Agents that pull, for the pull tests: their settings (short back-offs), an empty
containerd namespace per test (every image must be pulled), a watch of every
status a Sandbox showed, and the helpers to create one and wait on its phase.
Load with ``pytest_plugins`` (the integration conftest does)."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from urllib3.exceptions import ProtocolError

from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.api.common import GROUP, VERSION
from tests.support import agents
from tests.support.containerd import PrivateContainerd
from tests.support.wait import wait_for

SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']


# Beside agent_settings: a slower heartbeat and graceful stop, the reaper at its
# default, and pull back-offs short enough for a test.
AGENT_DEFAULTS: dict[str, Any] = {
    "call_timeout": "3s",
    "stop_grace": "1s",
    "sync_interval": "0.2s",
    "renew_interval": "2s",
    "reap_interval": AgentSettings.model_fields["reap_interval"].default,
    "image_pull_backoff": "0.5s",
    "image_pull_max_backoff": "2s",
    "image_pull_stall_timeout": "1s",
    "image_pull_deadline": "60s",
}


@pytest.fixture
def pull_ctr_ns(containerd: PrivateContainerd) -> Iterator[str]:
    """An empty containerd namespace: every image a sandbox runs must be pulled."""
    with agents.containerd_namespace(containerd, "pulls") as ns:
        yield ns


AgentFactory = Callable[..., Agent]


@pytest.fixture
def start_pull_agent(
    containerd: PrivateContainerd, pull_ctr_ns: str, tmp_path: Path
) -> Iterator[AgentFactory]:
    with agents.agent_fleet(containerd, pull_ctr_ns, tmp_path / "logs", **AGENT_DEFAULTS) as fleet:
        yield fleet.start


class StatusLog:
    """Every (phase, reason) a Sandbox's status showed from its construction on, seen
    by a watch.

    The watch starts from the resourceVersion of a listing made before the constructor
    returns, so no status written after that is missed however late the watch's own
    connection is made: a watch without one starts wherever the API server is when
    it connects, and a status shown only briefly (``Pulling`` for a fast pull) may
    already be gone by then."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.seen: dict[str, list[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self._watch = watch.Watch()
        listing: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes"
        )
        for obj in listing["items"]:
            self._record(obj)
        since = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, args=(api, namespace, since), daemon=True)
        self._thread.start()

    def _run(self, api: client.ApiClient, namespace: str, since: str) -> None:
        # The namespace's deletion at the test's end cuts the watch: that is its end.
        with contextlib.suppress(ProtocolError, client.ApiException):
            self._follow(api, namespace, since)

    def _follow(self, api: client.ApiClient, namespace: str, since: str) -> None:
        objs = client.CustomObjectsApi(api)
        for event in self._watch.stream(
            objs.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            resource_version=since,
            timeout_seconds=120,
        ):
            self._record(event["object"])

    def _record(self, obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        entry = (str(status.get("phase", "")), str(status.get("reason", "")))
        with self._lock:
            history = self.seen.setdefault(obj["metadata"]["name"], [])
            if not history or history[-1] != entry:
                history.append(entry)

    def reasons(self, name: str) -> list[str]:
        with self._lock:
            return [reason for _, reason in self.seen.get(name, [])]

    def stop(self) -> None:
        self._watch.stop()


@pytest.fixture
def status_log(kube: client.ApiClient, namespace: str) -> Iterator[StatusLog]:
    log = StatusLog(kube, namespace)
    yield log
    log.stop()


def create_sandbox(
    api: client.ApiClient, namespace: str, name: str, node: str, image: str, **spec: Any
) -> None:
    spec = {"image": image, "command": SLEEPER, **spec}
    agents.schedule_sandbox(api, namespace, name, node, spec)


def status_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    sb: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name
    )
    return dict(sb.get("status") or {})


def wait_phase(
    api: client.ApiClient, namespace: str, name: str, phase: str, timeout: float = 60
) -> dict[str, Any]:
    reached: dict[str, Any] = wait_for(
        lambda: (s := status_of(api, namespace, name)).get("phase") == phase and s,
        timeout=timeout,
        what=f"sandbox {namespace}/{name} {phase}",
    )
    return reached


def pulls(agent: Agent, outcome: str) -> float:
    value = agent.registry.get_sample_value("sandlot_agent_image_pulls_total", {"outcome": outcome})
    return value or 0.0


def node_name() -> str:
    return f"node-{uuid.uuid4().hex[:8]}"


def dockerconfig(host: str, user: str, password: str) -> str:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    document = json.dumps({"auths": {host: {"auth": auth}}}).encode()
    return base64.b64encode(document).decode()
