"""Fixtures for tests that run an in-process agent on the real containerd: a busybox
image archive (the module's ``IMAGE``), a fresh containerd namespace with it
imported and cleared after, a runtime on that namespace, and a node name of its own.
A module overrides any of them by defining a fixture of the same name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
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
