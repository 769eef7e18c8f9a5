"""A hostile image costs the agent a bounded amount of memory and fails its sandbox
naming the cap, claimed against the real containerd and API server.

The image is a gzip bomb under ``USER nobody``: one layer holding 2 GiB of zeros
(about 9 MiB compressed) with its ``/etc/passwd`` after them, so resolving the user
means reading past the zeros. It is imported without unpacking (only its content
is read, never a root filesystem).

A hostile registry is a server of its own here (a real registry refuses to store
what it sends): a 100 MiB manifest, a config its manifest says is 1 GiB, and one
that says 1000 bytes and then sends 1 GiB. The agent's pull client meets them over
a socket and stops each at its cap.
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.pulling import ContainerdPuller, Endpoint, RegistryError
from sandlot.adapters.runtime import ImageTooLarge
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.api.reasons import SandboxReason
from sandlot.policy.imagecaps import (
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_USER_LOOKUP_BYTES,
    mib,
)
from sandlot.policy.pulling import FailureKind, parse_reference
from tests.support import agents, hostile
from tests.support.containerd import PrivateContainerd
from tests.support.registry import LOOPBACK_ACCESS
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

BOMB = "docker.io/sandlot/gzip-bomb:test"
BUSYBOX = "docker.io/sandlot/hostile-neighbour-busybox:test"
# What the lookup may hold at its peak: a few read buffers, never the layer.
PEAK_BOUND = 32 * 2**20


@pytest.fixture(scope="module")
def bomb_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile.bomb_archive(tmp_path_factory.mktemp("hostile") / "bomb.tar", BOMB)


@pytest.fixture(scope="module")
def busybox_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, BUSYBOX)


@pytest.fixture
def ctr_ns(
    containerd: PrivateContainerd, bomb_archive: Path, busybox_archive: Path
) -> Iterator[str]:
    with agents.containerd_namespace(containerd, "hostile", busybox_archive) as ns:
        # Content only: unpacking would write the 2 GiB to disk, and nothing here runs it.
        argv = [containerd.ctr, "--address", containerd.address, "--namespace", ns]
        done = subprocess.run(
            [*argv, "images", "import", "--no-unpack", str(bomb_archive)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"ctr images import of the bomb failed: {done.stderr}"
        yield ns


def _vm_hwm() -> int:
    """This process's peak resident set (bytes) since the last reset."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_gzip_bomb_under_a_named_user_stops_at_the_cap_in_bounded_memory(
    containerd: PrivateContainerd, ctr_ns: str
) -> None:
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    # The peak resident set from here on: the kernel resets VmHWM to the current RSS.
    Path("/proc/self/clear_refs").write_text("5")
    rss_before = _vm_rss()
    refused: ImageTooLarge | None = None
    tracemalloc.start()
    try:
        rt.image_config(BOMB, timeout=60)
    except ImageTooLarge as exc:
        refused = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rt.close()
    grown = _vm_hwm() - rss_before
    print(
        f"USER lookup of the bomb: tracemalloc peak {peak / 2**20:.1f} MiB, "
        f"VmHWM {grown / 2**20:.1f} MiB above the RSS before it"
    )
    assert peak < PEAK_BOUND, f"the lookup held {peak / 2**20:.1f} MiB at its peak"
    assert grown < 4 * PEAK_BOUND, f"the process grew {grown / 2**20:.1f} MiB in the lookup"
    assert refused is not None, "the bomb's USER was resolved: its layer was read whole"
    assert f"more than {mib(MAX_USER_LOOKUP_BYTES)}" in str(refused), refused
    assert "the cap on the USER lookup" in str(refused), refused


def _decided(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", name
        )
        status = dict(sb.get("status") or {})
        return status if status.get("phase") in ("Running", "Failed", "Stopped") else None

    return wait_for(probe, timeout=60, what=f"sandbox {name} to run or fail")


def test_the_agent_fails_the_bombs_sandbox_naming_the_cap_and_keeps_working(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    tmp_path: Path,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        stack.callback(agents.delete_node, kube, node)
        fleet = stack.enter_context(agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs"))
        agent: Agent = fleet.start(kube, namespace, node, call_timeout="10s")
        agents.schedule_sandbox(kube, namespace, "bomb", node, {"image": BOMB})
        status = _decided(kube, namespace, "bomb")
        assert status["phase"] == "Failed", status
        assert status["reason"] == SandboxReason.IMAGE_TOO_LARGE, status
        assert "the cap on the USER lookup" in status["message"], status
        # The same agent goes on starting sandboxes: the bomb cost it nothing lasting.
        spec = {"image": BUSYBOX, "command": ["sleep", "300"]}
        agents.schedule_sandbox(kube, namespace, "after", node, spec)
        assert _decided(kube, namespace, "after")["phase"] == "Running"
        assert agent.node == node


@pytest.fixture(scope="module")
def hostile_registry() -> Iterator[str]:
    with hostile.hostile_registry() as host:
        yield host


@pytest.mark.parametrize(
    ("repository", "cap"),
    [
        ("huge-manifest", f"more than {mib(MAX_MANIFEST_BYTES)}, the cap"),
        ("huge-config", f"more than {mib(MAX_CONFIG_BYTES)}, the cap"),
        ("lying-config", "more than 1000 bytes, the cap"),
    ],
    ids=["100 MiB manifest", "config of 1 GiB by its descriptor", "config sending 1 GiB"],
)
def test_a_hostile_registry_is_refused_at_the_cap_in_bounded_memory(
    containerd: PrivateContainerd, hostile_registry: str, repository: str, cap: str
) -> None:
    name = f"{hostile_registry}/{repository}:1"
    puller = ContainerdPuller(
        containerd.address, containerd.namespace, transfer=False, access=LOOPBACK_ACCESS
    )
    endpoints = [Endpoint(f"http://{hostile_registry}")]
    tracemalloc.start()
    try:
        with pytest.raises(RegistryError) as refused:
            puller.pull(name, parse_reference(name), endpoints, None, deadline=60, labels={})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        puller.close()
    print(f"pull from a hostile registry ({repository}): tracemalloc peak {peak / 2**20:.1f} MiB")
    assert refused.value.kind is FailureKind.TOO_LARGE, refused.value
    assert cap in str(refused.value), refused.value
    assert peak < 2 * MAX_CONFIG_BYTES, f"the pull held {peak / 2**20:.1f} MiB at its peak"


def test_the_agent_fails_a_hostile_registrys_sandbox_as_too_large_naming_the_cap(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    hostile_registry: str,
    tmp_path: Path,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        stack.callback(agents.delete_node, kube, node)
        fleet = stack.enter_context(agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs"))
        fleet.start(kube, namespace, node, call_timeout="10s", image_pull_backoff="0.2s")
        image = f"{hostile_registry}/huge-manifest:1"
        agents.schedule_sandbox(kube, namespace, "lying", node, {"image": image})
        status = _decided(kube, namespace, "lying")
    assert status["phase"] == "Failed", status
    assert status["reason"] == SandboxReason.IMAGE_TOO_LARGE, status
    assert f"more than {mib(MAX_MANIFEST_BYTES)}, the cap" in status["message"], status


LAYER_CAP = 64 * 2**20


def _ctr_lines(containerd: PrivateContainerd, ns: str, *args: str) -> list[str]:
    argv = [containerd.ctr, "--address", containerd.address, "--namespace", ns, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"{' '.join(args)} failed: {done.stderr}"
    return done.stdout.splitlines()[1:]  # past the header line


def _pull_bomb(containerd: PrivateContainerd, ns: str, registry: str) -> RegistryError:
    name = f"{registry}/{hostile.BOMB_REPOSITORY}:1"
    puller = ContainerdPuller(
        containerd.address,
        ns,
        transfer=False,
        access=LOOPBACK_ACCESS,
        max_unpacked_layer=LAYER_CAP,
    )
    endpoints = [Endpoint(f"http://{registry}")]
    try:
        with pytest.raises(RegistryError) as refused:
            puller.pull(name, parse_reference(name), endpoints, None, deadline=120, labels={})
    finally:
        puller.close()
    return refused.value


def test_a_layer_unpacking_past_its_cap_is_refused_as_it_arrives_and_nothing_lands(
    containerd: PrivateContainerd, hostile_registry: str
) -> None:
    _, _, layer = hostile.bomb_image()
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    with agents.containerd_namespace(containerd, "unpacked") as ns:
        refused = _pull_bomb(containerd, ns, hostile_registry)
        assert refused.kind is FailureKind.TOO_LARGE, refused
        assert f"layer {layer_digest} unpacks to more than {mib(LAYER_CAP)}" in str(refused)
        assert "the cap on a layer (image_max_unpacked_layer)" in str(refused)
        # Refused before its commit: the layer is not in the content store, and
        # nothing was unpacked or named.
        content = _ctr_lines(containerd, ns, "content", "ls")
        assert not any(line.startswith(layer_digest) for line in content), content
        assert _ctr_lines(containerd, ns, "snapshots", "ls") == []
        assert _ctr_lines(containerd, ns, "images", "ls") == []


def test_a_layer_already_on_the_node_is_counted_before_it_is_applied(
    containerd: PrivateContainerd, ctr_ns: str, hostile_registry: str
) -> None:
    # ctr_ns holds the bomb's blobs (imported, never unpacked): the pull fetches
    # nothing and must count the stored layer before applying it.
    snapshots = _ctr_lines(containerd, ctr_ns, "snapshots", "ls")
    refused = _pull_bomb(containerd, ctr_ns, hostile_registry)
    assert refused.kind is FailureKind.TOO_LARGE, refused
    assert f"unpacks to more than {mib(LAYER_CAP)}, the cap on a layer" in str(refused)
    assert _ctr_lines(containerd, ctr_ns, "snapshots", "ls") == snapshots


def test_the_agent_fails_a_sandbox_whose_image_unpacks_past_the_cap(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    hostile_registry: str,
    tmp_path: Path,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        stack.callback(agents.delete_node, kube, node)
        ns = stack.enter_context(agents.containerd_namespace(containerd, "unpacked"))
        fleet = stack.enter_context(agents.agent_fleet(containerd, ns, tmp_path / "logs"))
        fleet.start(kube, namespace, node, call_timeout="10s", image_max_unpacked_layer="64Mi")
        image = f"{hostile_registry}/{hostile.BOMB_REPOSITORY}:1"
        agents.schedule_sandbox(kube, namespace, "unpacked", node, {"image": image})
        status = _decided(kube, namespace, "unpacked")
        snapshots = _ctr_lines(containerd, ns, "snapshots", "ls")
    assert status["phase"] == "Failed", status
    assert status["reason"] == SandboxReason.IMAGE_TOO_LARGE, status
    assert "unpacks to more than 64 MiB, the cap on a layer" in status["message"], status
    assert snapshots == [], snapshots
