"""Fixtures for tests that run an in-process agent on the real containerd: a busybox
image archive (the module's ``IMAGE``), a fresh containerd namespace with it
imported and cleared after, a runtime on that namespace, a node name of its own, and
an agent started on a node and a containerd namespace of its own (``started_agent``).
A module overrides any of them by defining a fixture of the same name."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.agent.main import Agent
from sandlot.devtools.containerd import PrivateContainerd
from tests.support import agents

DEFAULT_IMAGE = "docker.io/sandlot/agent-busybox:test"


def _prefix(request: pytest.FixtureRequest) -> str:
    """The namespace's prefix: the test module's name without ``test_``."""
    name: str = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    return name.replace("_", "-")[:20]


@pytest.fixture(scope="module")
def busybox_archive(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return agents.busybox_archive(tmp_path_factory, getattr(request.module, "IMAGE", DEFAULT_IMAGE))


@pytest.fixture
def ctr_ns(
    request: pytest.FixtureRequest, containerd: PrivateContainerd, busybox_archive: Path
) -> Iterator[str]:
    with agents.containerd_namespace(containerd, _prefix(request), busybox_archive) as ns:
        yield ns


@pytest.fixture
def rt(containerd: PrivateContainerd, ctr_ns: str) -> Iterator[ContainerdRuntime]:
    runtime = ContainerdRuntime(containerd.address, ctr_ns)
    yield runtime
    runtime.close()


@pytest.fixture
def node() -> str:
    return f"node-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def started_agent(
    request: pytest.FixtureRequest,
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    busybox_archive: Path,
    tmp_path: Path,
) -> Iterator[Agent]:
    """An agent whose start-up finished, on a node and a containerd namespace of its
    own holding the module's image (``agents.start_agent``); all of it gone after."""
    with contextlib.ExitStack() as stack:
        yield agents.start_agent(
            stack, kube, namespace, containerd, busybox_archive, tmp_path / "logs", _prefix(request)
        )
