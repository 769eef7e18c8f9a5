"""pytest fixtures for the real containerd: load with
``pytest_plugins = ["tests.support.containerd_fixtures"]``.

- ``containerd`` (session): a private containerd (``.address``, ``.root``,
  ``.namespace``, ``.line``); skipped with the reason when not root or not
  installed. Every test that uses it is parametrized by release line: 1.6 (the
  OS package) alone, or every line (1.6 and 2.x) for tests marked
  ``EVERY_CONTAINERD`` (``pytest.mark.containerd_lines``). pytest orders the
  tests so that each line's daemon starts once per worker.
- ``busybox_image`` (session): the name of a busybox image imported into it.
- ``image_factory`` (session): builds and imports distinct images on demand.
- ``runtime`` (function): a ``ContainerdRuntime`` on it, closed after the test.
- ``script_runs`` (function): runs a shell script in a container whose spec the
  agent's own ``build_oci_spec`` made (``ScriptRuns.run``); torn down after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.nodeguard import bounding_capabilities
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.teardown import teardown_many
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.ocispec import ALL_CAPABILITIES, ImageConfig, build_oci_spec
from tests.support.containerd import (
    PrivateContainerd,
    start_private_containerd,
    unavailable_reason,
)
from tests.support.wait import wait_for

BUSYBOX_IMAGE = "docker.io/sandlot/busybox:test"
LINE_OS, LINE_2 = "1.6", "2"
EVERY_CONTAINERD = pytest.mark.containerd_lines(LINE_OS, LINE_2)
"""Runs the marked tests (or module, as ``pytestmark``) on every release line."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "containerd_lines(*lines): the containerd release lines a test runs on"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "containerd" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("containerd_lines")
    lines = tuple(marker.args) if marker is not None else (LINE_OS,)
    metafunc.parametrize(
        "containerd",
        lines,
        indirect=True,
        scope="session",
        ids=[f"containerd{line}" for line in lines],
    )


@pytest.fixture(scope="session")
def containerd(request: pytest.FixtureRequest) -> Iterator[PrivateContainerd]:
    line = str(getattr(request, "param", LINE_OS))
    reason = unavailable_reason(line)
    if reason is not None:
        print(f"skipping containerd {line} tests: {reason}")
        pytest.skip(reason)
    from sandlot.devtools.gen_stubs import generate

    generate()  # a no-op when the stubs are current
    instance = start_private_containerd(line=line)
    try:
        yield instance
    finally:
        if instance.process is not None and instance.process.poll() is not None:
            print(  # a daemon that died mid-session explains the failures after it
                f"containerd {line} had exited with {instance.process.returncode}:\n"
                + instance.log_tail(120)
            )
        instance.stop()
        instance.remove()


ImageFactory = Callable[..., str]


@pytest.fixture(scope="session")
def image_factory(
    containerd: PrivateContainerd, tmp_path_factory: pytest.TempPathFactory
) -> ImageFactory:
    """``make(name, **build_options)`` builds, imports and returns an image name.

    The options are ``build_image_archive``'s (``salt``, ``filler_bytes``,
    ``as_index``, ``extra_files``, ...).
    """
    from sandlot.devtools.ociarchive import build_image_archive, import_archive

    directory = tmp_path_factory.mktemp("images")

    def make(name: str, **options: Any) -> str:
        archive = directory / (name.replace("/", "_").replace(":", "_") + ".tar")
        build_image_archive(Path(archive), name, **options)
        import_archive(
            containerd.address, containerd.namespace, archive, timeout=60, ctr=containerd.ctr
        )
        return name

    return make


@pytest.fixture(scope="session")
def busybox_image(image_factory: ImageFactory) -> str:
    return image_factory(BUSYBOX_IMAGE)


@pytest.fixture
def runtime(containerd: PrivateContainerd) -> Iterator[object]:
    from sandlot.adapters.containerd import ContainerdRuntime

    rt = ContainerdRuntime(containerd.address, containerd.namespace)
    try:
        yield rt
    finally:
        rt.close()


EXIT_MARK = "__exit="
NODE_CAPABILITIES = bounding_capabilities(ALL_CAPABILITIES)
"""What the node's bounding set allows (all of them, on the test machine)."""


class ScriptRuns:
    """Containers that run a shell script, one per ``run``; ``close`` tears them down."""

    def __init__(self, runtime: ContainerdRuntime, log_dir: Path) -> None:
        self.runtime = runtime
        self.log_dir = log_dir
        self.started: list[str] = []

    def run(
        self, image: str, script: str, *, config: ImageConfig | None = None, **spec: Any
    ) -> tuple[int, str]:
        """(exit code, output) of ``script`` in ``image``, the sandbox's ``spec``
        fields (camelCase) and ``pids_limit`` given; ``config`` is the image's as
        the agent's containerd client reads it unless given."""
        pids = {"pids_limit": spec.pop("pids_limit")} if "pids_limit" in spec else {}
        container_id = f"run-{uuid.uuid4().hex[:10]}"
        self.started.append(container_id)
        # The shim copies output to the log asynchronously, so the task's exit can
        # come before the last line: the script ends by printing its status, and
        # the log is read once that line is there. stderr joins stdout inside the
        # sandbox: two pipes would reach the log in no particular order.
        command = ["sh", "-c", f'{{ {script}\n}} 2>&1\necho "{EXIT_MARK}$?"']
        sandbox = SandboxSpec.model_validate({"image": image, "command": command, **spec})
        if config is None:
            config = self.runtime.image_config(image, timeout=10)
        oci = build_oci_spec(
            container_id,
            sandbox,
            config,
            hostname=container_id,
            node_capabilities=NODE_CAPABILITIES,
            **pids,
        )
        self.runtime.create_container(
            ContainerSpec(id=container_id, image=image, oci_spec=oci), timeout=10
        )
        log = self.log_dir / f"{container_id}.log"
        self.runtime.start_task(container_id, stdio=f"file://{log}", timeout=10)
        self.runtime.wait_task(container_id, timeout=30)
        text = wait_for(
            lambda: log.exists() and EXIT_MARK in log.read_text() and log.read_text(),
            timeout=10,
            what=f"the output of {container_id}",
        )
        output, _, code = text.rpartition(EXIT_MARK)
        return int(code.strip()), output

    def close(self) -> None:
        teardown_many(self.runtime, self.started, kill_wait=3, call_timeout=5, concurrency=4)


@pytest.fixture
def script_runs(runtime: ContainerdRuntime, tmp_path: Path) -> Iterator[ScriptRuns]:
    runs = ScriptRuns(runtime, tmp_path)
    try:
        yield runs
    finally:
        runs.close()
