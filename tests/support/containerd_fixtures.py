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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.containerd import (
    PrivateContainerd,
    start_private_containerd,
    unavailable_reason,
)

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
