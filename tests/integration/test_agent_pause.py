"""Paused sandboxes against the real control plane and a real, private containerd.

A sandbox counting in a loop is frozen (``spec.operatingMode: Paused``) and thawed
again: its counter stops while it is paused, survives an agent restart and the
reaper's passes, and goes on from where it was in the same process. Exec is
refused while it is paused, and deleting a paused sandbox stops it gracefully
within the stop's bound.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.nodeguard import cgroup_v2
from sandlot.adapters.runtime import ContainerSpec, TaskState
from sandlot.agent.main import Agent
from sandlot.agent.streams import StreamServer
from sandlot.agent.teardown import TeardownOutcome, teardown
from sandlot.api.common import GROUP, VERSION
from sandlot.policy.ocispec import cgroups_path_for
from sandlot.policy.streams import EXEC, LOG, StreamRequest
from tests.integration.test_agent_node import (
    CALL_TIMEOUT,
    IMAGE,
    KILL_WAIT,
    SLACK,
    container_ids,
    create_sandbox,
    get_sandbox,
    wait_phase,
)
from tests.support import agents
from tests.support.containerd import PrivateContainerd, scratch_spec
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

STOP_GRACE = 2.0
# Counts ten times a second; says "bye" when SIGTERM reaches it.
COUNTER = [
    "sh",
    "-c",
    "trap 'echo bye; exit 0' TERM; i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done",
]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def make_agent(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    log_dir: Path,
) -> Iterator[Callable[..., Agent]]:
    defaults = {
        "kill_wait": f"{KILL_WAIT}s",
        "call_timeout": f"{CALL_TIMEOUT}s",
        "stop_grace": f"{STOP_GRACE}s",
    }
    with agents.agent_fleet(containerd, ctr_ns, log_dir, **defaults) as fleet:
        yield functools.partial(fleet.make, kube, namespace, "node-pause")


def set_mode(kube: client.ApiClient, namespace: str, name: str, mode: str) -> None:
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name, {"spec": {"operatingMode": mode}}
    )


def paused_condition(sb: dict[str, Any] | None) -> dict[str, Any] | None:
    for c in ((sb or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == "Paused":
            return dict(c)
    return None


def wait_condition(
    kube: client.ApiClient, namespace: str, name: str, status: str, reason: str
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = get_sandbox(kube, namespace, name)
        c = paused_condition(sb)
        return sb if c and (c["status"], c["reason"]) == (status, reason) else None

    return wait_for(
        probe, timeout=15, what=f"sandbox {name}'s Paused condition {status} ({reason})"
    )


def counts(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split() if line.isdigit()]


def last_count(log: Path) -> int:
    found = counts(log)
    return found[-1] if found else 0


def log_of(log_dir: Path, sb: dict[str, Any]) -> Path:
    meta = sb["metadata"]
    return log_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}.log"


def cgroup_file(agent: Agent, container_id: str, v1_controller: str, name: str) -> Path:
    root = agent.settings.cgroup_root
    relative = cgroups_path_for(container_id, agent.settings.cgroup_parent).lstrip("/")
    if cgroup_v2(root):
        return Path(root) / relative / name
    return Path(root) / v1_controller / relative / name


def cpu_used(agent: Agent, container_id: str) -> int:
    """Nanoseconds of CPU the task's cgroup used so far."""
    if cgroup_v2(agent.settings.cgroup_root):
        stat = cgroup_file(agent, container_id, "", "cpu.stat").read_text().split()
        return int(stat[stat.index("usage_usec") + 1]) * 1000
    return int(cgroup_file(agent, container_id, "cpuacct", "cpuacct.usage").read_text())


def frozen(agent: Agent, container_id: str) -> bool:
    if cgroup_v2(agent.settings.cgroup_root):
        return cgroup_file(agent, container_id, "", "cgroup.freeze").read_text().strip() == "1"
    state = cgroup_file(agent, container_id, "freezer", "freezer.state").read_text().strip()
    return state == "FROZEN"


def reaper_passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_reaper_passes_total") or 0


def exec_refusal(agent: Agent, namespace: str, name: str, kind: str = EXEC) -> Any:
    """What the agent's stream server answers before an upgrade, from its own watch."""
    server = StreamServer(
        agent.node,
        bind="127.0.0.1",
        port=0,
        tls=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER),
        client_names=("gateway",),
        sandbox=agent.sandbox_watch.get,
        log_dir=str(agent.settings.log_dir),
        execs=object(),  # type: ignore[arg-type]  # never used before the upgrade
        call_timeout=CALL_TIMEOUT,
        stop=threading.Event(),
    )
    return server._sandbox_refusal(StreamRequest(kind, namespace, name, command=("true",)))


def watch_says(agent: Agent, key: str, test: Callable[[dict[str, Any]], bool]) -> bool:
    return test(agent.sandbox_watch.get(key) or {})


def test_a_paused_sandbox_keeps_its_process_and_memory_and_counts_on_after_resume(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    log_dir: Path,
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "counter", agent.node, command=COUNTER)
    running = wait_phase(kube, namespace, "counter", "Running", timeout=30)
    status, log = running["status"], log_of(log_dir, running)
    cid = status["containerId"]
    used = cpu_used(agent, cid)
    wait_for(lambda: last_count(log) >= 3, timeout=10, what="the counter to count")
    assert cpu_used(agent, cid) > used, "no CPU counted while it counts: the probe is blind"
    assert not frozen(agent, cid)
    assert exec_refusal(agent, namespace, "counter") is None, "exec refused while running"

    set_mode(kube, namespace, "counter", "Paused")
    paused = wait_condition(kube, namespace, "counter", "True", "Paused")
    for field in ("phase", "ip", "containerId", "pid", "startedAt"):
        assert paused["status"][field] == status[field], f"{field} changed by the pause"
    task = rt.get_task(status["containerId"], timeout=5)
    assert task is not None and task.state == TaskState.PAUSED and task.pid == status["pid"]

    assert frozen(agent, cid)
    frozen_at, used = last_count(log), cpu_used(agent, cid)
    passes = reaper_passes(agent)
    wait_for(
        lambda: reaper_passes(agent) >= passes + 2,
        timeout=10,
        what="two reaper passes over the paused sandbox",
    )
    assert last_count(log) == frozen_at, "the counter advanced while paused"
    assert cpu_used(agent, cid) == used, "the paused sandbox used CPU"
    assert status["containerId"] in container_ids(rt), "the reaper took a paused task"

    wait_for(
        lambda: watch_says(agent, f"{namespace}/counter", lambda sb: bool(paused_condition(sb))),
        timeout=10,
        what="the agent's watch to see the Paused condition",
    )
    refusal = exec_refusal(agent, namespace, "counter")
    assert refusal is not None and refusal[0] == 409 and "spec.operatingMode" in refusal[1]
    assert exec_refusal(agent, namespace, "counter", LOG) is None, "its log stays readable"

    agent.shutdown()  # a restarted agent adopts it paused, and leaves it so
    second = make_agent()
    assert second.start()
    assert second.sweep_report is not None
    assert second.sweep_report.adopted == {f"{namespace}/counter": status["containerId"]}
    task = rt.get_task(status["containerId"], timeout=5)
    assert task is not None and task.state == TaskState.PAUSED
    assert last_count(log) == frozen_at

    set_mode(kube, namespace, "counter", "Running")
    resumed = wait_condition(kube, namespace, "counter", "False", "Resumed")
    wait_for(
        lambda: last_count(log) >= frozen_at + 3,
        timeout=10,
        what=f"the counter to count on from {frozen_at}",
    )
    after = counts(log)
    assert after[after.index(frozen_at) + 1] == frozen_at + 1, "the count restarted"
    assert resumed["status"]["pid"] == status["pid"] and resumed["status"]["phase"] == "Running"
    task = rt.get_task(status["containerId"], timeout=5)
    assert task is not None and task.state == TaskState.RUNNING and task.pid == status["pid"]
    was, now = paused_condition(paused), paused_condition(resumed)
    assert was is not None and now is not None
    assert now["lastTransitionTime"] >= was["lastTransitionTime"]


# A few passes at once (the first may find the watches not yet synced, one starts
# the sandbox), then one every minute.
PACED = {"sync_interval": "360s", "sync_burst": 6, "resync_interval": "600s"}
AT_ONCE = "sandlot_agent_mode_changes_at_once_total"


@EVERY_CONTAINERD
def test_a_pause_and_a_resume_are_applied_from_the_watch_event_not_a_paced_pass(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
) -> None:
    """A spec's pause and resume are handed to the sandbox's work straight from the
    watch event (counted), so they need no sync pass, which the rate limit spaces a
    minute apart here once its few are spent."""
    agent = make_agent(**PACED)
    assert agent.start()
    create_sandbox(kube, namespace, "quick", agent.node, command=COUNTER)
    cid = wait_phase(kube, namespace, "quick", "Running", timeout=30)["status"]["containerId"]
    at_once = agent.registry.get_sample_value(AT_ONCE)
    assert at_once == 0, at_once
    for n in range(2):
        set_mode(kube, namespace, "quick", "Paused")
        wait_condition(kube, namespace, "quick", "True", "Paused")
        assert frozen(agent, cid)
        set_mode(kube, namespace, "quick", "Running")
        wait_condition(kube, namespace, "quick", "False", "Resumed")
        task = rt.get_task(cid, timeout=5)
        assert task is not None and task.state is TaskState.RUNNING, task
        assert agent.registry.get_sample_value(AT_ONCE) == 2 * (n + 1)
    # A resume arriving while the pause is still being applied: handed over as soon as
    # the pause's work ends, not left for a pass.
    set_mode(kube, namespace, "quick", "Paused")
    set_mode(kube, namespace, "quick", "Running")
    wait_for(
        lambda: agent.registry.get_sample_value(AT_ONCE) == 6,
        timeout=15,
        what="the pause and the resume right behind it both handed over at once",
    )
    wait_condition(kube, namespace, "quick", "False", "Resumed")
    assert not frozen(agent, cid)


def unrecorded_thaws(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_unrecorded_thaws_total") or 0


def test_a_task_frozen_with_nothing_recording_it_is_thawed_by_the_next_pass(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    log_dir: Path,
) -> None:
    """The fault of every lost freeze record (an idle freeze whose condition write
    failed, a pause that timed out after it landed, a snapshot's thaw that timed
    out): the task is frozen in containerd while the spec and the conditions say
    Running. The next pass (one a second, with nothing changing) finds it, reads
    again, and thaws it."""
    agent = make_agent(resync_interval="1s")
    assert agent.start()
    create_sandbox(kube, namespace, "lost", agent.node, command=COUNTER)
    sb = wait_phase(kube, namespace, "lost", "Running", timeout=30)
    log, cid = log_of(log_dir, sb), sb["status"]["containerId"]
    wait_for(lambda: last_count(log) >= 2, timeout=10, what="the counter to count")
    assert unrecorded_thaws(agent) == 0

    rt.pause_task(cid, timeout=5)  # the freeze lands; no record of it is ever written
    assert frozen(agent, cid)
    resumed = wait_condition(kube, namespace, "lost", "False", "Resumed")
    assert resumed["spec"]["operatingMode"] == "Running"
    assert not frozen(agent, cid), "the condition says Resumed but the cgroup is frozen"
    assert unrecorded_thaws(agent) == 1
    at = last_count(log)
    wait_for(lambda: last_count(log) > at, timeout=10, what="the counter to count after the thaw")


# Sleeps in the background so the shell takes SIGTERM at once; its handler then
# sleeps (quiet, so idle) before it says it ran.
SLOW_HANDLER = ["sh", "-c", "trap 'sleep 4; echo handled; exit 0' TERM; sleep 100000 & wait"]


def test_the_idle_loop_never_freezes_a_sandbox_while_its_drain_stops_it(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    log_dir: Path,
) -> None:
    """A drain's graceful stop thaws the task and sends SIGTERM; the handler then
    sleeps past the sandbox's idle timeout. The idle loop (sampling every 0.2 s)
    finds it quiet, but the stop holds the sandbox's work slot: it is not frozen,
    and its handler runs to the end within the stop's grace."""
    agent = make_agent(idle_interval="0.2s", stop_grace="12s")
    assert agent.start()
    create_sandbox(kube, namespace, "draining", agent.node, command=SLOW_HANDLER)
    sb = wait_phase(kube, namespace, "draining", "Running", timeout=30)
    log, cid = log_of(log_dir, sb), sb["status"]["containerId"]
    idle = agent.registry.get_sample_value("sandlot_agent_idle_passes_total") or 0
    api = client.CustomObjectsApi(kube)
    api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "draining", {"spec": {"idleTimeoutSeconds": 1}}
    )
    wait_for(
        lambda: watch_says(
            agent, f"{namespace}/draining", lambda b: b["spec"].get("idleTimeoutSeconds") == 1
        ),
        timeout=10,
        what="the agent's view to carry the idle timeout",
    )
    drained = {"spec": {"unschedulable": True}}
    api.patch_cluster_custom_object(GROUP, VERSION, "sandboxnodes", agent.node, drained)
    try:
        stopped = wait_phase(kube, namespace, "draining", "Stopped", timeout=40)
    finally:  # the module's other tests run on this node too
        uncordoned = {"spec": {"unschedulable": False}}
        api.patch_cluster_custom_object(GROUP, VERSION, "sandboxnodes", agent.node, uncordoned)
    passes = (agent.registry.get_sample_value("sandlot_agent_idle_passes_total") or 0) - idle
    assert passes >= 10, f"only {passes:g} idle passes ran while it stopped: nothing was tested"
    assert stopped["status"].get("reason") == "Drained"
    assert "handled" in log.read_text().split(), (
        "the SIGTERM handler never finished: the idle loop froze the task the drain was stopping"
    )
    assert not any(
        (c["type"], c["status"]) == ("Paused", "True")
        for c in stopped["status"].get("conditions") or []
    ), "paused for being idle while it stopped"
    assert cid not in container_ids(rt)


def test_deleting_a_paused_sandbox_stops_it_gracefully_within_the_bound(
    make_agent: Callable[..., Agent],
    kube: client.ApiClient,
    namespace: str,
    rt: ContainerdRuntime,
    log_dir: Path,
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "frozen", agent.node, command=COUNTER)
    sb = wait_phase(kube, namespace, "frozen", "Running", timeout=30)
    log, container = log_of(log_dir, sb), sb["status"]["containerId"]
    wait_for(lambda: last_count(log) >= 2, timeout=10, what="the counter to count")
    set_mode(kube, namespace, "frozen", "Paused")
    wait_condition(kube, namespace, "frozen", "True", "Paused")
    task = rt.get_task(container, timeout=5)
    assert task is not None and task.state == TaskState.PAUSED

    began = time.monotonic()
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "frozen"
    )
    # Thawing takes two calls before the SIGTERM; the stop's grace and teardown follow.
    bound = 3 * CALL_TIMEOUT + STOP_GRACE + KILL_WAIT + 4 * CALL_TIMEOUT + SLACK
    wait_for(
        lambda: container not in container_ids(rt),
        timeout=bound,
        what=f"container {container} of the deleted paused sandbox to be gone",
    )
    took = time.monotonic() - began
    assert "bye" in log.read_text().split(), (
        f"SIGTERM never reached the paused sandbox (gone after {took:.1f}s)"
    )


@EVERY_CONTAINERD
def test_a_paused_task_is_killed_by_the_teardown_within_its_bound(
    rt: ContainerdRuntime,
) -> None:
    cid = "paused-teardown"
    spec = scratch_spec(["sleep", "1000"], cid, host_network=True)
    rt.create_container(ContainerSpec(id=cid, image=IMAGE, oci_spec=spec, labels={}), timeout=10)
    rt.start_task(cid, stdio="", timeout=10)
    rt.pause_task(cid, timeout=5)
    task = rt.get_task(cid, timeout=5)
    assert task is not None and task.state == TaskState.PAUSED, f"not paused: {task}"

    result = teardown(rt, cid, kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)
    assert result.outcome is TeardownOutcome.CLEAN, result
    assert result.elapsed < KILL_WAIT, f"SIGKILL did not end the frozen task: {result}"
    assert cid not in container_ids(rt)


def test_the_api_server_defaults_the_mode_and_refuses_an_unknown_one_naming_the_field(
    kube: client.ApiClient, namespace: str
) -> None:
    api = client.CustomObjectsApi(kube)
    sb = create_sandbox(kube, namespace, "plain", "node-pause")
    assert sb["spec"]["operatingMode"] == "Running"
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "later"},
        "spec": {"image": IMAGE, "operatingMode": "Hibernating"},
    }
    with pytest.raises(client.ApiException) as caught:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", body)
    assert caught.value.status == 422
    assert "spec.operatingMode" in str(caught.value.body) and "Suspended" in str(caught.value.body)
    body["spec"]["operatingMode"] = "Suspended"
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", body)
