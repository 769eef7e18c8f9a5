"""Suspended sandboxes against the real control plane and a real, private containerd.

A sandbox writes a file and is suspended (``spec.operatingMode: Suspended``): its
filesystem is committed to an image in the node's store, its container and task
are removed, an agent restart keeps it suspended, and ``Running`` again starts a
new container from the committed image with the file still there.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import ContainerSpec, RuntimeTimeout, TaskState
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.agent.main import Agent
from sandlot.agent.teardown import teardown
from sandlot.api.common import GROUP, VERSION, key_of
from sandlot.policy.suspension import suspended_image_name
from tests.integration.test_agent_node import (
    CALL_TIMEOUT,
    IMAGE,
    KILL_WAIT,
    container_ids,
    create_sandbox,
    get_sandbox,
    wait_phase,
)
from tests.integration.test_agent_pause import exec_refusal, log_of, set_mode, watch_says
from tests.support import agents
from tests.support.containerd import PrivateContainerd, scratch_spec
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

# Writes a file (its content names the first container), then reports what it finds.
WRITER = [
    "sh",
    "-c",
    "[ -f /kept ] || echo written-before > /kept; "
    "trap 'exit 0' TERM; while true; do echo seen-$(cat /kept); sleep 0.2; done",
]


@pytest.fixture(scope="module")
def busybox_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


@pytest.fixture
def ctr_ns(containerd: PrivateContainerd, busybox_archive: Path) -> Iterator[str]:
    with agents.containerd_namespace(containerd, "suspend", busybox_archive) as ns:
        yield ns


@pytest.fixture
def rt(containerd: PrivateContainerd, ctr_ns: str) -> Iterator[ContainerdRuntime]:
    runtime = ContainerdRuntime(containerd.address, ctr_ns)
    yield runtime
    runtime.close()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def fleet(containerd: PrivateContainerd, ctr_ns: str, log_dir: Path) -> Iterator[agents.AgentFleet]:
    defaults = {
        "kill_wait": f"{KILL_WAIT}s",
        "call_timeout": f"{CALL_TIMEOUT}s",
        "stop_grace": "2s",
    }
    with agents.agent_fleet(containerd, ctr_ns, log_dir, **defaults) as made:
        yield made


@pytest.fixture
def make_agent(
    kube: client.ApiClient, namespace: str, fleet: agents.AgentFleet
) -> Callable[..., Agent]:
    return functools.partial(fleet.make, kube, namespace, "node-suspend")


def condition(sb: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((sb or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def wait_suspended(
    kube: client.ApiClient, namespace: str, name: str, status: str, reason: str
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = get_sandbox(kube, namespace, name)
        c = condition(sb, "Suspended")
        return sb if c and (c["status"], c["reason"]) == (status, reason) else None

    return wait_for(
        probe, timeout=60, what=f"sandbox {name}'s Suspended condition {status} ({reason})"
    )


@EVERY_CONTAINERD
def test_a_committed_container_starts_again_with_its_files(rt: ContainerdRuntime) -> None:
    cid = "commit-me"
    script = "echo kept > /kept; sleep 1000"
    spec = scratch_spec(["sh", "-c", script], cid, host_network=True)
    rt.create_container(ContainerSpec(id=cid, image=IMAGE, oci_spec=spec, labels={}), timeout=10)
    rt.start_task(cid, stdio="", timeout=10)
    wait_for(
        lambda: (Path(rt.writable_layer(cid, timeout=5)) / "kept").exists(),
        timeout=10,
        what="the file in the writable layer",
    )
    rt.pause_task(cid, timeout=5)
    name = suspended_image_name("commit-me-uid")
    digest = rt.commit_container(cid, name, {"sandlot.dev/test": "1"}, timeout=30)
    assert digest.startswith("sha256:")
    teardown(rt, cid, kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)
    assert name in {i.name for i in rt.list_images(timeout=10)}
    rt.collect_garbage(timeout=30)  # the image holds its content and snapshots

    again = "again"
    spec = scratch_spec(["sleep", "1000"], again, host_network=True)
    rt.create_container(ContainerSpec(id=again, image=name, oci_spec=spec, labels={}), timeout=10)
    rt.start_task(again, stdio="", timeout=10)
    try:
        task = rt.get_task(again, timeout=5)
        assert task is not None
        assert Path(f"/proc/{task.pid}/root/kept").read_text() == "kept\n"
    finally:
        teardown(rt, again, kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)


def sync_passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_sync_passes_total") or 0


def saw_after(log: Path, marker: str) -> bool:
    return marker in log.read_text() if log.exists() else False


def test_a_suspended_sandbox_has_no_container_and_comes_back_with_its_files(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    log_dir: Path,
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "writer", agent.node, command=WRITER)
    running = wait_phase(kube, namespace, "writer", "Running", timeout=30)
    cid, log = running["status"]["containerId"], log_of(log_dir, running)
    wait_for(lambda: saw_after(log, "seen-written-before"), timeout=10, what="the file written")
    # What a restarted container says it sees once it reads the kept file again.
    (Path(rt.writable_layer(cid, timeout=5)) / "kept").write_text("kept-across\n")
    wait_for(lambda: saw_after(log, "seen-kept-across"), timeout=10, what="the rewritten file")

    set_mode(kube, namespace, "writer", "Suspended")
    suspended = wait_suspended(kube, namespace, "writer", "True", "Suspended")
    assert suspended["status"]["phase"] == "Running"
    wait_for(lambda: cid not in container_ids(rt), timeout=30, what=f"container {cid} removed")
    assert rt.get_task(cid, timeout=5) is None, "its task outlived the suspension"
    image = suspended_image_name(running["metadata"]["uid"])
    assert image in {i.name for i in rt.list_images(timeout=10)}
    wait_for(
        lambda: (exec_refusal(agent, namespace, "writer") or (0, ""))[0] == 409,
        timeout=10,
        what="exec refused on the suspended sandbox",
    )
    refusal = exec_refusal(agent, namespace, "writer")
    assert "Suspended" in refusal[1] and "spec.operatingMode" in refusal[1], refusal

    agent.shutdown()  # a restarted agent neither loses it nor starts it
    second = make_agent()
    assert second.start()
    rt.collect_garbage(timeout=30)  # its image holds the committed filesystem
    wait_for(
        lambda: sync_passes(second) >= 1,
        timeout=20,
        what="a sync pass of the restarted agent over the suspended sandbox",
    )
    again = get_sandbox(kube, namespace, "writer")
    assert again is not None and again["status"]["phase"] == "Running", again
    held = condition(again, "Suspended")
    assert held is not None and held["status"] == "True", again
    assert cid not in container_ids(rt)

    log.write_text("")
    set_mode(kube, namespace, "writer", "Running")
    restored = wait_suspended(kube, namespace, "writer", "False", "Restored")
    assert restored["status"]["phase"] == "Running"
    assert cid in container_ids(rt)
    wait_for(
        lambda: saw_after(log, "seen-kept-across"),
        timeout=15,
        what="the restored sandbox to see the file written before its suspension",
    )
    task = rt.get_task(cid, timeout=5)
    assert task is not None and task.pid == restored["status"]["pid"]
    wait_for(
        lambda: exec_refusal(second, namespace, "writer") is None,
        timeout=10,
        what="exec allowed again once restored",
    )


def test_a_deleted_suspended_sandboxs_image_goes_with_the_next_gc_pass(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "gone", agent.node, command=WRITER)
    running = wait_phase(kube, namespace, "gone", "Running", timeout=30)
    image = suspended_image_name(running["metadata"]["uid"])
    set_mode(kube, namespace, "gone", "Suspended")
    wait_suspended(kube, namespace, "gone", "True", "Suspended")
    assert agent.collector is not None
    agent.collector.run_watermark()
    assert image in {i.name for i in rt.list_images(timeout=10)}, "a live sandbox's state went"

    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "gone"
    )
    wait_for(
        lambda: agent.sandbox_watch.get(f"{namespace}/gone") is None,
        timeout=15,
        what="the agent's watch to see the sandbox deleted",
    )
    agent.collector.run_watermark()
    assert image not in {i.name for i in rt.list_images(timeout=10)}


def test_a_drained_node_ends_a_suspended_sandbox_and_its_image_goes(
    fleet: agents.AgentFleet, kube: client.ApiClient, namespace: str, rt: ContainerdRuntime
) -> None:
    node = f"node-drain-{namespace}"
    agent = fleet.make(kube, namespace, node)
    assert agent.start()
    create_sandbox(kube, namespace, "parked", node, command=WRITER)
    running = wait_phase(kube, namespace, "parked", "Running", timeout=30)
    image = suspended_image_name(running["metadata"]["uid"])
    set_mode(kube, namespace, "parked", "Suspended")
    wait_suspended(kube, namespace, "parked", "True", "Suspended")

    client.CustomObjectsApi(kube).patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", node, {"spec": {"unschedulable": True}}
    )
    status = wait_phase(kube, namespace, "parked", "Stopped", timeout=20)["status"]
    assert status["reason"] == "Drained" and "suspended" in status["message"], status
    wait_for(
        lambda: watch_says(
            agent, f"{namespace}/parked", lambda sb: sb["status"]["phase"] == "Stopped"
        ),
        timeout=10,
        what="the agent's watch to see the sandbox Stopped",
    )
    assert agent.collector is not None
    agent.collector.run_watermark()
    assert image not in {i.name for i in rt.list_images(timeout=10)}


class LaggingWatch:
    """The agent's Sandbox watch, behind for one sandbox: its events are held, then
    delivered in order by ``release`` (the node's watch stays current). The fault a
    drain meets when its request to suspend reaches the agent after its cordon."""

    def __init__(self, watch: WatchCache, key: str) -> None:
        self.key = key
        self.held: list[tuple[str, Mapping[str, Any]]] = []
        self._holding = True
        self._lock = threading.Lock()
        self._deliver = watch._deliver
        watch._deliver = self._maybe_hold  # type: ignore[method-assign]

    def _maybe_hold(self, event_type: str, raw: Mapping[str, Any]) -> None:
        with self._lock:
            if self._holding and event_type != "SYNC" and key_of(raw) == self.key:
                self.held.append((event_type, raw))
                return
        self._deliver(event_type, raw)

    def release(self) -> None:
        with self._lock:
            self._holding, held, self.held = False, self.held, []
        for event_type, raw in held:  # one older than the watch's latest is dropped there
            self._deliver(event_type, raw)


def test_a_drain_s_cordon_seen_before_its_suspend_request_stops_nothing(
    fleet: agents.AgentFleet,
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sandlot.agent.sync")
    node = f"node-move-{namespace}"
    agent = fleet.make(kube, namespace, node)
    assert agent.start()
    create_sandbox(kube, namespace, "mover", node, command=WRITER)
    cid = wait_phase(kube, namespace, "mover", "Running", timeout=30)["status"]["containerId"]

    # What `drain --move` does, in its order, with the suspend request held back from
    # the agent's view: the agent sees the cordon beside a sandbox still to run.
    lag = LaggingWatch(agent.sandbox_watch, f"{namespace}/mover")
    set_mode(kube, namespace, "mover", "Suspended")
    wait_for(lambda: lag.held, timeout=10, what="the suspend request held from the agent")
    client.CustomObjectsApi(kube).patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", node, {"spec": {"unschedulable": True}}
    )

    def declined() -> bool:
        sb = get_sandbox(kube, namespace, "mover") or {}
        assert sb.get("status", {}).get("phase") == "Running", f"stopped: {sb.get('status')}"
        return "mover: not stopped for the drain" in caplog.text

    wait_for(
        declined,
        timeout=20,
        what="the drain's stop, planned on the lagging view, declined on a fresh read",
    )
    sb = get_sandbox(kube, namespace, "mover")
    assert sb is not None and sb["status"]["phase"] == "Running", sb
    assert cid in container_ids(rt), "the container was stopped for the drain"

    lag.release()  # the pass its event wakes suspends it (no registry: it ends here)
    status = wait_phase(kube, namespace, "mover", "Stopped", timeout=60)["status"]
    assert status["reason"] == "Drained" and "suspended" in status["message"], status
    suspended = condition(get_sandbox(kube, namespace, "mover"), "Suspended")
    assert suspended is not None and suspended["status"] == "True", suspended


def log_passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_log_passes_total") or 0


def test_a_suspended_sandbox_keeps_its_log_and_a_restore_appends_to_it(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    log_dir: Path,
) -> None:
    """logs: the log pass runs beside a sandbox with no container on purpose and
    leaves its files; the restored container's output goes on in the same file."""
    agent = make_agent(log_interval="0.2s")
    assert agent.start()
    create_sandbox(kube, namespace, "talker", agent.node, command=WRITER)
    running = wait_phase(kube, namespace, "talker", "Running", timeout=30)
    cid, log = running["status"]["containerId"], log_of(log_dir, running)
    wait_for(lambda: saw_after(log, "seen-written-before"), timeout=10, what="its output")

    set_mode(kube, namespace, "talker", "Suspended")
    wait_suspended(kube, namespace, "talker", "True", "Suspended")
    wait_for(lambda: cid not in container_ids(rt), timeout=30, what=f"container {cid} removed")
    wait_for(
        lambda: watch_says(
            agent,
            f"{namespace}/talker",
            lambda sb: (condition(sb, "Suspended") or {}).get("status") == "True",
        ),
        timeout=10,
        what="the agent's watch to see the suspension",
    )
    passes = log_passes(agent)
    wait_for(
        lambda: log_passes(agent) >= passes + 2,
        timeout=20,
        what="two log passes over the suspended sandbox with no container",
    )
    assert log.exists(), "the log pass removed a suspended sandbox's log"
    before = log.read_text()
    assert "seen-written-before" in before

    set_mode(kube, namespace, "talker", "Running")
    wait_suspended(kube, namespace, "talker", "False", "Restored")
    wait_for(
        lambda: log.read_text().count("seen-written-before") > before.count("seen-written-before"),
        timeout=15,
        what="the restored sandbox's output appended to its log",
    )
    assert log.read_text().startswith(before), "the log was begun again on restore"


class TaskDeleteMissesItsDeadline:
    """The real runtime, except that while ``failing`` is set, deleting the task of
    ``target`` gets no answer in time (``RuntimeTimeout``, nothing done): a shim that
    stops answering deletes. Armed before a suspend, its teardown kills the task and
    then fails to delete it, after the Suspended record was written: the stopped task
    is left behind. Every other call is real."""

    def __init__(self, inner: ContainerdRuntime) -> None:
        self._inner = inner
        self.target = ""
        self.failing = threading.Event()
        self.missed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def delete_task(self, container_id: str, *, timeout: float) -> Any:
        if self.failing.is_set() and container_id == self.target:
            self.missed += 1
            raise RuntimeTimeout(f"delete task {container_id}: no answer within {timeout}s")
        return self._inner.delete_task(container_id, timeout=timeout)


def reaper_passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_reaper_passes_total") or 0


def test_the_reaper_leaves_a_suspension_whose_task_delete_missed_its_deadline(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    rt: ContainerdRuntime,
) -> None:
    """kept-suspended: a reaper pass over the stopped task a failed suspend left
    behind neither ends the sandbox nor removes the container; the sync's REMOVE
    step does, once the delete answers, and the committed state serves a restore."""
    faulty = TaskDeleteMissesItsDeadline(ContainerdRuntime(containerd.address, ctr_ns))
    agent = make_agent(runtime_factory=lambda: faulty)
    assert agent.start()
    create_sandbox(kube, namespace, "keeper", agent.node, command=WRITER)
    running = wait_phase(kube, namespace, "keeper", "Running", timeout=30)
    faulty.target = cid = running["status"]["containerId"]
    image = suspended_image_name(running["metadata"]["uid"])

    faulty.failing.set()  # the suspend's task delete, and every one after, misses
    set_mode(kube, namespace, "keeper", "Suspended")
    wait_suspended(kube, namespace, "keeper", "True", "Suspended")

    def stopped_task_left() -> bool:
        task = rt.get_task(cid, timeout=5)
        return faulty.missed >= 1 and task is not None and task.state is TaskState.STOPPED

    wait_for(stopped_task_left, timeout=30, what="the suspend to leave its stopped task behind")
    passes = reaper_passes(agent)
    wait_for(
        lambda: reaper_passes(agent) >= passes + 2,
        timeout=20,
        what="a whole reaper pass over the stopped task",
    )
    sb = get_sandbox(kube, namespace, "keeper")
    assert sb is not None and sb["status"]["phase"] == "Running", sb and sb["status"]
    held = condition(sb, "Suspended")
    assert held is not None and held["status"] == "True", sb["status"]
    assert cid in container_ids(rt), "the reaper tore down a suspension's leftover"

    faulty.failing.clear()  # the shim answers again: the sync's REMOVE step finishes
    wait_for(lambda: cid not in container_ids(rt), timeout=30, what=f"container {cid} removed")
    sb = get_sandbox(kube, namespace, "keeper")
    assert sb is not None and sb["status"]["phase"] == "Running", sb and sb["status"]
    assert image in {i.name for i in rt.list_images(timeout=10)}, "its committed state went"

    set_mode(kube, namespace, "keeper", "Running")
    restored = wait_suspended(kube, namespace, "keeper", "False", "Restored")
    assert Path(f"/proc/{restored['status']['pid']}/root/kept").read_text() == "written-before\n"
