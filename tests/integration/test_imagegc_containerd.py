"""Image GC against a real containerd, and ``sandlot cache clear containerd`` end to end.

Each test imports the same few dozen small distinct images (one OCI archive, one
``ctr import``) into its own containerd namespace, so a forced pass never
reaches images other tests use. Some images back real running containers, one
is pinned, and each gets a distinct last-used label. The deletes are real; only
the disk-usage source is injected (``ImageSizedDisk``): a filesystem whose used
bytes are a fixed part plus the sizes containerd reports for the images still
stored, so "full" and "not full" are exact and each real delete lowers usage by
that image's bytes.
"""

from __future__ import annotations

import contextlib
import json
import random
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import (
    ContainerInfo,
    ContainerSpec,
    ImageRecord,
    RuntimeError_,
    TaskState,
)
from sandlot.agent.imagegc import GcOutcome, ImageCollector
from sandlot.agent.main import Agent
from sandlot.agent.netsettings import NetworkMode
from sandlot.agent.settings import AgentSettings
from sandlot.agent.teardown import teardown_many
from sandlot.api.common import GROUP, VERSION
from sandlot.cli.main import main as sandlot_main
from sandlot.devtools.controlplane import ControlPlane
from sandlot.policy.imagegc import DiskUsage, GcThresholds, HoldReason, under_pressure
from tests.support.agents import schedule_sandbox
from tests.support.containerd import PrivateContainerd, scratch_spec
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.image_sets import allocated_bytes, build_image_set, import_image_set
from tests.support.operator import Fleet
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

N_IMAGES = 30
IMAGES = [f"docker.io/sandlot/gc-{i:02d}:1" for i in range(N_IMAGES)]
IN_USE = IMAGES[3:6]
PINNED = IMAGES[7]
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']
BASE = datetime.now(UTC) - timedelta(days=2)
"""Last-used labels count from here: older than any import, so order is the labels'."""


@pytest.fixture(scope="module")
def image_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_image_set(
        tmp_path_factory.mktemp("gc-images") / "set.tar", IMAGES, filler_bytes=4096
    )


@pytest.fixture
def gc_ns(containerd: PrivateContainerd, image_set: Path) -> Iterator[str]:
    ns = f"gc-{uuid.uuid4().hex[:8]}"
    import_image_set(containerd.address, ns, image_set)
    yield ns
    rt = ContainerdRuntime(containerd.address, ns)
    try:
        ids = [c.id for c in rt.list_containers(timeout=10)]
        teardown_many(rt, ids, kill_wait=3, call_timeout=3, concurrency=8)
        for record in rt.list_images(timeout=10):
            with contextlib.suppress(RuntimeError_):
                rt.delete_image(record.name, timeout=10)
    finally:
        rt.close()


@pytest.fixture
def rt(containerd: PrivateContainerd, gc_ns: str) -> Iterator[ContainerdRuntime]:
    runtime = ContainerdRuntime(containerd.address, gc_ns)
    yield runtime
    runtime.close()


class ImageSizedDisk:
    """A filesystem of ``total`` bytes whose used part is ``non_image`` plus the sizes
    of the images containerd still lists (read from the real containerd on every call)."""

    def __init__(self, rt: ContainerdRuntime, total: int, non_image: int = 0) -> None:
        self.rt, self.total, self.non_image = rt, total, non_image

    def image_bytes(self) -> int:
        return sum(r.size for r in self.rt.list_images(timeout=10))

    def __call__(self) -> DiskUsage:
        return DiskUsage(self.total, self.non_image + self.image_bytes())


def run_containers(rt: ContainerdRuntime, images: list[str]) -> list[str]:
    ids = []
    # Unique per call: the same test runs beside itself against another containerd
    # version, in the same namespace names.
    run = uuid.uuid4().hex[:6]
    for i, image in enumerate(images):
        cid = f"gc-user-{run}-{i}"
        spec = scratch_spec(SLEEPER, cid, host_network=True)
        rt.create_container(ContainerSpec(id=cid, image=image, oci_spec=spec), timeout=10)
        rt.start_task(cid, stdio="", timeout=10)
        ids.append(cid)
    return ids


def stamp_last_used(collector: ImageCollector) -> list[str]:
    """Give every image a distinct last-used time; protected images get the oldest, so the
    veto (not the order) is what keeps them. Returns the names, least recently used first."""
    others = [n for n in IMAGES if n not in (*IN_USE, PINNED)]
    random.Random(5).shuffle(others)
    order = [*IN_USE, PINNED, *others]
    for i, name in enumerate(order):
        assert collector.touch_image(name, now=BASE + timedelta(minutes=i))
    return order


def stored(rt: ContainerdRuntime) -> set[str]:
    return {r.name for r in rt.list_images(timeout=10)}


def sizes(rt: ContainerdRuntime) -> dict[str, int]:
    return {r.name: r.size for r in rt.list_images(timeout=10)}


NO_AGE = GcThresholds(high_percent=85, low_percent=80, min_age=timedelta(0))


@EVERY_CONTAINERD
def test_watermark_pass_evicts_least_recently_used_unprotected_images_down_to_low_mark(
    rt: ContainerdRuntime,
) -> None:
    run_containers(rt, IN_USE)
    image_bytes = sum(sizes(rt).values())
    disk = ImageSizedDisk(rt, total=int(image_bytes / 0.90))  # 90% used: over the high mark
    collector = ImageCollector(rt, disk, NO_AGE, pinned=[PINNED], call_timeout=10)
    order = stamp_last_used(collector)
    before = sizes(rt)
    assert under_pressure(disk(), NO_AGE), "premise: the disk counts as full"

    result = collector.run_watermark(now=datetime.now(UTC))

    assert result.outcome is GcOutcome.OK and result.error is None
    lru_unprotected = [n for n in order if n not in (*IN_USE, PINNED)]
    k = result.records_removed
    assert 0 < k < len(lru_unprotected), "the pass must stop before taking everything"
    assert list(result.removed) == lru_unprotected[:k]
    assert stored(rt) == set(IMAGES) - set(lru_unprotected[:k])
    # Stopped at the low mark: at or under it now, and one delete fewer would not be.
    after = disk()
    assert result.usage_after == after and after.percent <= NO_AGE.low_percent
    last = lru_unprotected[k - 1]
    assert 100 * (after.used_bytes + before[last]) / after.total_bytes > NO_AGE.low_percent
    assert result.bytes_freed == sum(before[n] for n in lru_unprotected[:k])
    assert result.bytes_to_free is not None and result.bytes_to_free > 0
    assert result.held_back[HoldReason.IN_USE] == sum(before[n] for n in IN_USE)
    assert result.held_back[HoldReason.PINNED] == before[PINNED]


@EVERY_CONTAINERD
def test_on_an_unpressured_node_watermark_removes_nothing_and_forced_removes_every_unprotected(
    rt: ContainerdRuntime,
) -> None:
    run_containers(rt, IN_USE)
    disk = ImageSizedDisk(rt, total=100 * sum(sizes(rt).values()))
    collector = ImageCollector(rt, disk, NO_AGE, pinned=[PINNED], call_timeout=10)
    stamp_last_used(collector)
    assert not under_pressure(disk(), NO_AGE), "premise: the disk is far from full"

    watermark = collector.run_watermark(now=datetime.now(UTC))
    assert watermark.outcome is GcOutcome.NOTHING_TO_DO and watermark.records_removed == 0
    assert watermark.held_back.get(HoldReason.TOO_YOUNG, 0) == 0  # nothing, for lack of pressure
    assert stored(rt) == set(IMAGES)

    forced = collector.run_forced(now=datetime.now(UTC))
    assert forced.outcome is GcOutcome.OK and forced.error is None
    assert forced.bytes_to_free is None
    assert set(forced.removed) == set(IMAGES) - {*IN_USE, PINNED}
    assert stored(rt) == {*IN_USE, PINNED}
    assert forced.bytes_freed > 0


CONTENT_STORE = "io.containerd.content.v1.content"
SNAPSHOTTER = "io.containerd.snapshotter.v1.overlayfs"


def blob_file(containerd: PrivateContainerd, digest: str) -> Path:
    algorithm, hexdigest = digest.split(":", 1)
    return containerd.root / CONTENT_STORE / "blobs" / algorithm / hexdigest


def blobs_of(containerd: PrivateContainerd, record: ImageRecord) -> set[str]:
    """The digests an image references, read from its manifest in the content store on disk."""
    manifest = json.loads(blob_file(containerd, record.target_digest).read_bytes())
    return {
        record.target_digest,
        manifest["config"]["digest"],
        *(layer["digest"] for layer in manifest["layers"]),
    }


class ContainerdDisk:
    """Usage measured on disk: the bytes allocated under containerd's content store and
    snapshotter, on a filesystem of ``total`` bytes (far from full)."""

    def __init__(self, containerd: PrivateContainerd, total: int) -> None:
        self.dirs = [containerd.root / CONTENT_STORE, containerd.root / SNAPSHOTTER]
        self.total = total

    def __call__(self) -> DiskUsage:
        return DiskUsage(self.total, sum(allocated_bytes(d) for d in self.dirs))


@EVERY_CONTAINERD
def test_forced_pass_frees_the_space_on_disk_and_keeps_every_protected_image(
    rt: ContainerdRuntime, containerd: PrivateContainerd
) -> None:
    ids = run_containers(rt, IN_USE)
    records = {r.name: r for r in rt.list_images(timeout=10)}
    protected = {*IN_USE, PINNED}
    kept = set().union(*(blobs_of(containerd, records[n]) for n in protected))
    doomed = set().union(
        *(blobs_of(containerd, r) for n, r in records.items() if n not in protected)
    )
    doomed -= kept  # the shared base layer stays: protected images use it
    assert doomed and all(blob_file(containerd, d).is_file() for d in doomed | kept)  # premise
    doomed_bytes = sum(blob_file(containerd, d).stat().st_blocks * 512 for d in doomed)
    collector = ImageCollector(
        rt, ContainerdDisk(containerd, total=1 << 40), NO_AGE, pinned=[PINNED], call_timeout=10
    )

    result = collector.run_forced(now=datetime.now(UTC))

    assert result.outcome is GcOutcome.OK and result.error is None
    assert set(result.removed) == set(IMAGES) - protected
    assert stored(rt) == protected
    assert [d for d in doomed if blob_file(containerd, d).exists()] == [], (
        "the pass returned before containerd collected the deleted images' content"
    )
    assert all(blob_file(containerd, d).is_file() for d in kept)
    assert result.bytes_freed >= doomed_bytes  # measured on disk after the collection
    running = {t.container_id for t in rt.list_tasks(timeout=10) if t.state is TaskState.RUNNING}
    assert running >= set(ids)


class ContainerListingFails:
    """The real runtime, except that containers are listed through a containerd socket
    with nothing behind it: the listing fails for real (UNAVAILABLE) while image deletes
    would still work."""

    def __init__(self, inner: ContainerdRuntime, dead_socket: Path) -> None:
        self._inner = inner
        self._dead = ContainerdRuntime(str(dead_socket), inner.namespace)

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        return self._dead.list_containers(timeout=timeout)

    def close(self) -> None:
        self._dead.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("kind", ["forced", "watermark"])
@EVERY_CONTAINERD
def test_pass_aborts_with_nothing_deleted_when_containers_cannot_be_listed(
    rt: ContainerdRuntime, kind: str, tmp_path: Path
) -> None:
    run_containers(rt, IN_USE)
    disk = ImageSizedDisk(rt, total=int(sum(sizes(rt).values()) / 0.95))
    assert under_pressure(disk(), NO_AGE), "premise: the watermark pass would evict"
    broken = ContainerListingFails(rt, tmp_path / "stopped-containerd.sock")
    try:
        with pytest.raises(RuntimeError_):
            broken.list_containers(timeout=5)  # premise: the listing really fails
        collector = ImageCollector(broken, disk, NO_AGE, call_timeout=5)
        result = collector.run(kind, now=datetime.now(UTC))  # type: ignore[arg-type]
    finally:
        broken.close()

    assert result.outcome is GcOutcome.ABORTED and result.records_removed == 0
    assert result.error is not None and "cannot list containers" in result.error
    assert stored(rt) == set(IMAGES)


# ------------------------------------------------------------------ the CLI, end to end


def _custom(kube: client.ApiClient) -> Any:
    return client.CustomObjectsApi(kube)


@pytest.fixture
def cacheprunes(kube: client.ApiClient) -> Iterator[Callable[[str], dict[str, Any]]]:
    """``find(node)``: the CachePrune targeting ``node``; every one made here is deleted after."""
    api = _custom(kube)
    before = {
        p["metadata"]["name"]
        for p in api.list_cluster_custom_object(GROUP, VERSION, "cacheprunes")["items"]
    }

    def find(node: str) -> dict[str, Any]:
        found = [
            p
            for p in api.list_cluster_custom_object(GROUP, VERSION, "cacheprunes")["items"]
            if p["metadata"]["name"] not in before and node in (p["spec"].get("nodes") or [])
        ]
        assert len(found) == 1, f"expected one new CachePrune for {node}, got {len(found)}"
        return dict(found[0])

    yield find
    for p in api.list_cluster_custom_object(GROUP, VERSION, "cacheprunes")["items"]:
        if p["metadata"]["name"] not in before:
            with contextlib.suppress(ApiException):
                api.delete_cluster_custom_object(
                    GROUP, VERSION, "cacheprunes", p["metadata"]["name"]
                )


def _delete_node(kube: client.ApiClient, name: str) -> None:
    api = _custom(kube)
    with contextlib.suppress(ApiException):
        api.patch_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", name, {"metadata": {"finalizers": None}}
        )
        api.delete_cluster_custom_object(GROUP, VERSION, "sandboxnodes", name)


@pytest.fixture
def gc_agent(
    kube: client.ApiClient,
    containerd: PrivateContainerd,
    gc_ns: str,
    rt: ContainerdRuntime,
) -> Iterator[Callable[..., Agent]]:
    """``start(lease_namespace)``: an in-process agent on ``gc_ns`` with ``PINNED`` pinned,
    no minimum age and a disk far from full; its SandboxNode is removed after the test."""
    agents: list[Agent] = []

    def start(lease_namespace: str) -> Agent:
        settings = AgentSettings(
            default_ephemeral_storage_limit="",  # not about disk: no node-wide limit
            node_name=f"gc-node-{uuid.uuid4().hex[:6]}",
            namespace=lease_namespace,
            containerd_address=containerd.address,
            containerd_namespace=gc_ns,
            containerd_root=str(containerd.root),
            kill_wait=timedelta(seconds=2),
            call_timeout=timedelta(seconds=10),
            sync_interval=timedelta(seconds=0.3),
            reap_interval=timedelta(seconds=1),
            lease_duration=timedelta(seconds=10),
            renew_interval=timedelta(seconds=1),
            metrics_port=0,
            node_address="10.9.8.7",
            network_mode=NetworkMode.HOST_ADDRESS,  # whatever the host's /etc/cni/net.d holds
            pinned_image=[PINNED],
            gc_min_age=timedelta(seconds=0),
            gc_interval=timedelta(hours=1),
        )
        disk = ImageSizedDisk(rt, total=100 * sum(sizes(rt).values()))
        agent = Agent(settings, kube, registry=CollectorRegistry(), disk_usage=disk)
        agents.append(agent)
        assert agent.start()
        return agent

    yield start
    for agent in agents:
        agent.shutdown()
        _delete_node(kube, agent.node)


def run_sandboxes(kube: client.ApiClient, namespace: str, node: str, images: list[str]) -> None:
    for i, image in enumerate(images):
        schedule_sandbox(kube, namespace, f"user-{i}", node, {"image": image, "command": SLEEPER})


def clear(control_plane: ControlPlane, *args: str) -> int:
    return sandlot_main(
        [
            "cache",
            "clear",
            "containerd",
            *args,
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--timeout",
            "60s",
        ]
    )


def _result(prune: Mapping[str, Any], node: str) -> dict[str, Any]:
    return dict(prune["status"]["results"][node])


def test_cache_clear_without_all_removes_nothing_then_with_all_removes_every_unprotected_image(
    gc_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    control_plane: ControlPlane,
    rt: ContainerdRuntime,
    cacheprunes: Callable[[str], dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    agent = gc_agent(namespace)
    node = agent.node
    run_sandboxes(kube, namespace, node, IN_USE)
    assert agent.collector is not None
    assert not under_pressure(agent._disk_usage(), agent.collector.thresholds)  # premise

    assert clear(control_plane, "--node", node) == 0
    watermark = _result(cacheprunes(node), node)
    assert watermark["pass"] == "watermark" and watermark.get("error") is None
    assert watermark["recordsRemoved"] == 0
    assert (watermark["heldBack"].get("tooYoung") or 0) == 0
    assert stored(rt) == set(IMAGES)
    out = capsys.readouterr().out
    assert "1/1 nodes reported" in out and "watermark" in out

    # The same node, now with --all. A fresh finder: this request is the new one.
    for p in _custom(kube).list_cluster_custom_object(GROUP, VERSION, "cacheprunes")["items"]:
        if node in (p["spec"].get("nodes") or []):
            _custom(kube).delete_cluster_custom_object(
                GROUP, VERSION, "cacheprunes", p["metadata"]["name"]
            )
    before = sizes(rt)
    assert clear(control_plane, "--all", "--node", node) == 0
    forced = _result(cacheprunes(node), node)
    unprotected = set(IMAGES) - {*IN_USE, PINNED}
    assert forced["pass"] == "forced" and forced.get("error") is None
    assert forced["recordsRemoved"] == len(unprotected)
    assert forced["bytesFreed"] == sum(before[n] for n in unprotected)
    assert forced["heldBack"]["inUse"] == sum(before[n] for n in IN_USE)
    assert forced["heldBack"]["pinned"] == before[PINNED]
    assert stored(rt) == {*IN_USE, PINNED}
    out = capsys.readouterr().out
    assert "forced" in out and f"{node} " in out
    gc = _custom(kube).get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)["status"][
        "gc"
    ]
    assert gc["lastPassKind"] == "forced" and gc["recordsRemoved"] == len(unprotected)


def test_cache_clear_answers_for_unknown_and_notready_nodes_and_exits_nonzero_naming_them(
    operators: Callable[..., Any],
    fleet: Fleet,
    lease_namespace: str,
    gc_agent: Callable[..., Agent],
    control_plane: ControlPlane,
    rt: ContainerdRuntime,
    cacheprunes: Callable[[str], dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    operators()
    agent = gc_agent(lease_namespace)  # its Lease where the operator looks
    stale = fleet.node("stale")  # a SandboxNode whose agent never renewed a Lease
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"

    code = clear(control_plane, "--node", agent.node, "--node", ghost, "--node", stale)

    captured = capsys.readouterr()
    assert code == 1
    assert f'node "{ghost}" does not exist' in captured.out
    assert f'node "{stale}" is NotReady: its agent is not running' in captured.out
    assert ghost in captured.err and stale in captured.err and agent.node not in captured.err
    prune = cacheprunes(ghost)
    assert prune["status"]["targets"] == [agent.node, ghost, stale]
    assert _result(prune, agent.node)["pass"] == "watermark"
    assert _result(prune, agent.node).get("error") is None
    assert _result(prune, ghost)["error"] == f'node "{ghost}" does not exist'
    wait_for(
        lambda: cacheprunes(ghost)["status"].get("phase") == "Failed",
        timeout=15,
        what="the request's phase to be Failed",
    )
    assert stored(rt) == set(IMAGES)
