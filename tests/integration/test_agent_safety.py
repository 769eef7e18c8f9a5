"""The agent never acts on a guess: against the real API server and containerd.

- a cleared image-GC backoff leaves the SandboxNode (a merge patch keeps what it
  does not name), so a restarted agent does not restore and obey it;
- the image is marked used before the container is created from it;
- graceful stops of sandboxes that ignore SIGTERM run beside, not inside, the
  bounded pool: starts and fences on the node go on meanwhile.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.objects import Objects
from sandlot.adapters.runtime import (
    ContainerSpec,
    NotFound,
    RuntimeError_,
    TaskInfo,
    TaskState,
)
from sandlot.adapters.sandboxwatch import cache_prunes
from sandlot.agent.cacheprune import CacheUpkeep
from sandlot.agent.imagegc import GcOutcome, ImageCollector
from sandlot.agent.main import Agent
from sandlot.agent.teardown import TeardownOutcome, teardown
from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import parse_time
from sandlot.devtools.containerd import (
    PrivateContainerd,
    all_threads_stopped,
    find_shim_pid,
    scratch_spec,
    stopped_process,
)
from sandlot.policy.imagegc import DiskUsage, GcThresholds
from tests.support import agents
from tests.support.agent import FakeRuntime
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

IMAGE = "docker.io/sandlot/safety-busybox:test"
# PID 1 of the container ignores SIGTERM: only the SIGKILL after the grace ends it.
DEAF = ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']
GIB = 1 << 30


def _custom(kube: client.ApiClient) -> Any:
    return client.CustomObjectsApi(kube)


# ---------------------------------------------------------------- the GC backoff


def test_cleared_gc_backoff_leaves_the_sandboxnode_and_is_not_restored(
    kube: client.ApiClient,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    objs = _custom(kube)
    objs.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sandboxnodes",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxNode", "metadata": {"name": node}},
    )
    usage = {"used": 95 * GIB}
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    collector = ImageCollector(
        FakeRuntime(),  # no image at all: nothing is evictable
        lambda: DiskUsage(100 * GIB, usage["used"]),
        GcThresholds(high_percent=85, low_percent=80),
        clock=lambda: now,
        call_timeout=2,
    )
    upkeep = CacheUpkeep(Objects(kube), node, cache_prunes(kube), collector, lambda: now)

    def stored_until() -> Any:
        gc = (
            objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node).get("status") or {}
        ).get("gc") or {}
        return gc.get("exhaustedUntil", "absent")

    try:
        armed = collector.run_watermark(now)
        assert armed.outcome is GcOutcome.EXHAUSTED and armed.exhausted_until is not None
        upkeep.record_gc(armed)
        assert parse_time(stored_until()) == now + timedelta(minutes=30), (
            "the armed backoff was not recorded: the clearing below would prove nothing"
        )

        usage["used"] = 50 * GIB  # the disk was freed: the backoff's premise is gone
        cleared = collector.run_forced(now)
        assert cleared.exhausted_until is None
        upkeep.record_gc(cleared)
        assert stored_until() == "absent", (
            f"exhaustedUntil {stored_until()} stayed on the SandboxNode after the backoff "
            "cleared: a restarted agent would restore it and mute GC"
        )
        node_obj = Objects(kube).get_node(node) or {}
        gc = (node_obj.get("status") or {}).get("gc") or {}
        assert gc["lastPassKind"] == "forced", "the second pass was not recorded at all"
    finally:
        objs.delete_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)


# ---------------------------------------------------------------- agent on containerd


@pytest.fixture
def make_agent(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    node: str,
    tmp_path: Path,
) -> Iterator[Callable[..., Agent]]:
    with agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs") as fleet:
        yield functools.partial(fleet.make, kube, namespace, node)


def create_sandbox(
    kube: client.ApiClient,
    namespace: str,
    name: str,
    node: str,
    command: list[str],
    **spec: Any,
) -> None:
    spec = {"image": IMAGE, "command": command, **spec}
    agents.schedule_sandbox(kube, namespace, name, node, spec)


def status_of(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    sb = _custom(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)
    return dict(sb.get("status") or {})


def wait_running(
    kube: client.ApiClient, namespace: str, name: str, timeout: float
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = status_of(kube, namespace, name)
        return status if status.get("phase") == "Running" else None

    return wait_for(probe, timeout=timeout, what=f"sandbox {namespace}/{name} Running")


class RecordingRuntime:
    """The real containerd runtime, with the order of the calls that matter written down."""

    def __init__(self, inner: ContainerdRuntime, calls: list[tuple[str, str]]) -> None:
        self._inner = inner
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def set_image_labels(self, name: str, labels: Any, *, timeout: float) -> None:
        self.calls.append(("set_image_labels", name))
        self._inner.set_image_labels(name, labels, timeout=timeout)

    def create_container(self, spec: Any, *, timeout: float) -> Any:
        self.calls.append(("create_container", spec.image))
        return self._inner.create_container(spec, timeout=timeout)


@pytest.mark.containerd
def test_image_is_marked_used_before_its_container_is_created(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    node: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    rt: ContainerdRuntime,
) -> None:
    calls: list[tuple[str, str]] = []
    agent = make_agent(
        runtime_factory=lambda: RecordingRuntime(
            ContainerdRuntime(containerd.address, ctr_ns), calls
        )
    )
    assert agent.start()
    began = datetime.now(UTC) - timedelta(seconds=1)
    create_sandbox(kube, namespace, "fresh", node, SLEEPER)
    wait_running(kube, namespace, "fresh", timeout=30)
    ordered = [c for c in calls if c[1] == IMAGE]
    assert ("create_container", IMAGE) in ordered, f"no container was created: {calls}"
    assert ordered.index(("set_image_labels", IMAGE)) < ordered.index(
        ("create_container", IMAGE)
    ), f"the container was created before its image was marked used: {ordered}"
    record = next(r for r in rt.list_images(timeout=10) if r.name == IMAGE)
    stamped = parse_time(record.labels.get("sandlot.dev/last-used"))
    assert stamped is not None and stamped >= began, f"label not fresh: {record.labels}"


# ---------------------------------------------------------------- task lookup fails


class KillSaysGone:
    """The real runtime, except that kill answers "process already finished": the
    moment a task exits just as its shim stops answering. The task lookup goes to the
    real containerd; against a stopped shim it times out, or containerd answers first
    with the task's state UNKNOWN (it races the same deadline): asked again then, so
    the teardown meets the failing lookup it is tested for. Every other call is real."""

    def __init__(self, inner: ContainerdRuntime) -> None:
        self._inner = inner
        self.lookups: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None:
        raise NotFound(f"task {container_id}: process already finished")

    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        for _ in range(10):
            try:
                task = self._inner.get_task(container_id, timeout=timeout)
            except RuntimeError_ as exc:
                self.lookups.append(type(exc).__name__)
                raise
            self.lookups.append(task.state.value if task else "none")
            if task is None or task.state is not TaskState.UNKNOWN:
                return task
        raise AssertionError(f"containerd never failed the lookup: {self.lookups}")


@pytest.mark.containerd
def test_teardown_keeps_a_container_whose_task_lookup_fails_on_a_wedged_shim(
    containerd: PrivateContainerd, rt: ContainerdRuntime
) -> None:
    cid = f"wedged-{uuid.uuid4().hex[:8]}"  # a shim is found by its container's id
    spec = scratch_spec(["sleep", "1000"], cid, host_network=True)
    rt.create_container(ContainerSpec(id=cid, image=IMAGE, oci_spec=spec, labels={}), timeout=10)
    pid = rt.start_task(cid, stdio="", timeout=10).pid
    shim = find_shim_pid(containerd.address, cid, pid)
    with stopped_process(shim):
        # SIGSTOP takes hold of a busy multi-threaded process a moment later.
        wait_for(lambda: all_threads_stopped(shim), timeout=10, what=f"shim {shim} stopped")
        wedged = KillSaysGone(rt)
        result = teardown(wedged, cid, kill_wait=1, call_timeout=1)
        assert wedged.lookups and wedged.lookups[-1] == "RuntimeTimeout", (
            f"the lookup did not fail: {wedged.lookups}: the teardown below proves nothing"
        )
        assert cid in {c.id for c in rt.list_containers(timeout=5)}, (
            "the container record was deleted while its task may be alive"
        )
    assert result.outcome is TeardownOutcome.ERROR and any(
        "get task" in e for e in result.errors
    ), result
    task = rt.get_task(cid, timeout=5)
    assert task is not None and task.pid == pid, "the task was touched"


# ---------------------------------------------------------------- long graceful stops


@pytest.mark.containerd
def test_long_graceful_stops_do_not_hold_up_starts_or_fences(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    node: str,
    rt: ContainerdRuntime,
) -> None:
    concurrency = 2
    agent = make_agent(teardown_concurrency=concurrency, stop_grace="3600s")
    assert agent.start()
    deaf = [f"deaf{i}" for i in range(8)]
    for name in [*deaf, "fenced"]:
        create_sandbox(
            kube,
            namespace,
            name,
            node,
            DEAF if name != "fenced" else SLEEPER,
            terminationGracePeriodSeconds=3600,
        )
    running = {n: wait_running(kube, namespace, n, timeout=60) for n in [*deaf, "fenced"]}

    # Delete the deaf ones: each gets SIGTERM, ignores it, and its stop waits out an hour.
    for name in deaf:
        _custom(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)

    def all_stopping() -> bool:
        return all(f"{namespace}/{n}" in agent.pool.in_flight() for n in deaf)

    wait_for(all_stopping, timeout=20, what=f"all {len(deaf)} graceful stops in flight")

    began = time.monotonic()
    create_sandbox(kube, namespace, "newcomer", node, SLEEPER)
    try:
        wait_running(kube, namespace, "newcomer", timeout=20)
    except AssertionError as exc:
        raise AssertionError(
            f"a start waited behind {len(deaf)} graceful stops (teardown_concurrency="
            f"{concurrency}): {exc}"
        ) from None
    started_in = time.monotonic() - began

    _custom(kube).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        "fenced",
        {"status": {"phase": "Dead", "reason": "NodeLost"}},
    )
    fenced_id = running["fenced"]["containerId"]
    wait_for(
        lambda: fenced_id not in {c.id for c in rt.list_containers(timeout=5)},
        timeout=20,
        what=f"the fenced container {fenced_id} torn down while graceful stops wait",
    )
    for name in deaf:  # still in their grace: SIGTERM ignored, nothing killed early
        task = rt.get_task(running[name]["containerId"], timeout=5)
        assert task is not None and task.state == TaskState.RUNNING, (
            f"{name} was killed before its grace ended (started in {started_in:.1f}s)"
        )

    ending = time.monotonic()
    agent.shutdown()
    assert time.monotonic() - ending < 20, "agent shutdown waited for graceful stops"
