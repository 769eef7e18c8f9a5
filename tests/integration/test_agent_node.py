"""The node agent against the real control plane and a real, private containerd.

Each test gets its own containerd namespace (the agent owns everything in its
namespace and would sweep other tests' containers) with the busybox image
imported, its own node name and Kubernetes namespace. The agent runs in-process
with short bounds; every wait here has a deadline and says what it waited for.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.objects import Leases
from sandlot.adapters.runtime import ContainerSpec, TaskState
from sandlot.agent.main import Agent
from sandlot.agent.metrics import START_PHASES
from sandlot.agent.teardown import TeardownOutcome, teardown_many
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import SANDBOX_LABEL
from tests.support import agents
from tests.support.containerd import (
    PrivateContainerd,
    find_shim_pid,
    scratch_spec,
    stopped_process,
)
from tests.support.passes import agent_passes, wait_agent_passes
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

IMAGE = "docker.io/sandlot/agent-busybox:test"
KILL_WAIT = 2.0
CALL_TIMEOUT = 2.0
BOUND = KILL_WAIT + 4 * CALL_TIMEOUT
SLACK = 3.0
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']


AgentFactory = Callable[..., Agent]


@pytest.fixture
def make_agent(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    node: str,
    tmp_path: Path,
) -> Iterator[AgentFactory]:
    defaults = {"kill_wait": f"{KILL_WAIT}s", "call_timeout": f"{CALL_TIMEOUT}s"}
    with agents.agent_fleet(containerd, ctr_ns, tmp_path / "logs", **defaults) as fleet:
        yield functools.partial(fleet.make, kube, namespace, node)


def _custom(kube: client.ApiClient) -> Any:
    return client.CustomObjectsApi(kube)


def create_sandbox(
    kube: client.ApiClient,
    namespace: str,
    name: str,
    node: str,
    *,
    command: list[str] | None = None,
    image: str = IMAGE,
    phase: str = "Scheduled",
    pull_policy: str = "IfNotPresent",
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "command": command or SLEEPER,
            "nodeName": node,
            "imagePullPolicy": pull_policy,
        },
    }
    body["spec"].update(spec or {})
    api = _custom(kube)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", body)
    for step in ("Scheduled", phase) if phase != "Scheduled" else ("Scheduled",):
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "sandboxes", name, {"status": {"phase": step}}
        )
    return dict(api.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name))


def get_sandbox(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(
            _custom(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def wait_phase(
    kube: client.ApiClient, namespace: str, name: str, phase: str, timeout: float = 20
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = get_sandbox(kube, namespace, name)
        status = (sb or {}).get("status") or {}
        if status.get("phase") == phase:
            return sb
        assert sb is not None, f"sandbox {name} is gone"
        return None

    return wait_for(probe, timeout=timeout, what=f"sandbox {namespace}/{name} to be {phase}")


def start_container(rt: ContainerdRuntime, container_id: str, labels: dict[str, str]) -> int:
    spec = scratch_spec(["sleep", "1000"], container_id, host_network=True)
    rt.create_container(
        ContainerSpec(id=container_id, image=IMAGE, oci_spec=spec, labels=labels), timeout=10
    )
    return rt.start_task(container_id, stdio="", timeout=10).pid


def container_ids(rt: ContainerdRuntime) -> set[str]:
    return {c.id for c in rt.list_containers(timeout=10)}


# -------------------------------------------------------------------------------- tests


def test_scheduled_sandbox_runs_and_its_container_goes_when_deleted(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, rt
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "web", node)
    sb = wait_phase(kube, namespace, "web", "Running")
    status = sb["status"]
    assert status["ip"] == "10.1.2.3" and status["startedAt"]
    task = rt.get_task(status["containerId"], timeout=5)
    assert task is not None and task.state == TaskState.RUNNING and task.pid == status["pid"]
    # The start's time, phase by phase: each observed, none of them free.
    for phase in START_PHASES:
        sample = {"phase": phase}
        count = agent.registry.get_sample_value("sandlot_agent_start_phase_seconds_count", sample)
        seconds = agent.registry.get_sample_value("sandlot_agent_start_phase_seconds_sum", sample)
        assert count and count >= 1 and seconds and seconds > 0, (phase, count, seconds)

    _custom(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", "web")
    wait_for(
        lambda: status["containerId"] not in container_ids(rt),
        timeout=15,
        what=f"container {status['containerId']} of the deleted sandbox to be gone",
    )


def test_restarted_agent_readopts_running_sandboxes_with_the_same_pids(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, rt
) -> None:
    first = make_agent()
    assert first.start()
    for name in ("a", "b"):
        create_sandbox(kube, namespace, name, node)
    before = {n: wait_phase(kube, namespace, n, "Running")["status"] for n in ("a", "b")}
    first.shutdown()

    second = make_agent(resync_interval="0.5s")  # passes run without a change to wake them
    assert second.start()
    assert second.sweep_report is not None
    assert second.sweep_report.adopted == {
        f"{namespace}/{n}": before[n]["containerId"] for n in ("a", "b")
    }
    assert second.registry.get_sample_value("sandlot_agent_readopted_total") == 2
    # A few sync passes run over the adopted sandboxes: they must not touch them.
    wait_agent_passes(second, agent_passes(second), 3, timeout=20)
    for name in ("a", "b"):
        sb = get_sandbox(kube, namespace, name)
        assert sb is not None, name
        status = sb["status"]
        assert status["phase"] == "Running"
        assert status["pid"] == before[name]["pid"]
        task = rt.get_task(status["containerId"], timeout=5)
        assert task is not None and task.state == TaskState.RUNNING
        assert task.pid == before[name]["pid"]


def test_sandbox_marked_dead_while_agent_was_down_is_torn_down_on_boot(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, rt
) -> None:
    first = make_agent()
    assert first.start()
    create_sandbox(kube, namespace, "fenced", node)
    container = wait_phase(kube, namespace, "fenced", "Running")["status"]["containerId"]
    first.shutdown()
    _custom(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "fenced", {"status": {"phase": "Dead"}}
    )

    second = make_agent()
    assert second.start()
    # start() returns after the sweep: the container is gone already, never re-adopted.
    assert container not in container_ids(rt)
    assert second.registry.get_sample_value("sandlot_agent_fenced_total") == 1
    fenced = get_sandbox(kube, namespace, "fenced")
    assert fenced is not None and fenced["status"]["phase"] == "Dead", fenced


def test_orphans_are_removed_before_the_lease_is_first_renewed(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, rt
) -> None:
    create_sandbox(kube, namespace, "ended", node, phase="Stopped")
    create_sandbox(kube, namespace, "elsewhere", "some-other-node", phase="Running")
    orphans = {
        "orphan-nosb": {SANDBOX_LABEL: f"{namespace}/never-existed"},
        "orphan-ended": {SANDBOX_LABEL: f"{namespace}/ended"},
        "orphan-elsewhere": {SANDBOX_LABEL: f"{namespace}/elsewhere"},
        "orphan-unlabelled": {},
    }
    for container_id, labels in orphans.items():
        start_container(rt, container_id, labels)
    leases = Leases(kube, namespace)
    assert leases.get(node) is None

    agent = make_agent()
    seen_at_first_renewal: list[set[str]] = []
    renew = agent.heartbeat.renew

    def watched_renew():
        if not seen_at_first_renewal:
            seen_at_first_renewal.append(container_ids(rt))
        return renew()

    agent.heartbeat.renew = watched_renew  # type: ignore[method-assign]
    assert agent.start()
    assert seen_at_first_renewal == [set()], "orphans were still there when the lease was renewed"
    lease = leases.get(node)
    assert lease is not None and lease.holder == node and lease.renew_time is not None
    assert agent.registry.get_sample_value("sandlot_agent_orphans_removed_total") == 4


def test_wedged_shim_during_startup_is_bounded_and_named(
    make_agent: AgentFactory,
    kube: client.ApiClient,
    namespace: str,
    node: str,
    rt,
    containerd: PrivateContainerd,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start_container(rt, "orphan-ok", {SANDBOX_LABEL: f"{namespace}/gone-1"})
    pid = start_container(rt, "orphan-wedged", {SANDBOX_LABEL: f"{namespace}/gone-2"})
    shim = find_shim_pid(containerd.address, "orphan-wedged", pid)
    agent = make_agent()
    outcome: dict[str, Any] = {}

    def boot() -> None:
        began = time.monotonic()
        outcome["ok"] = agent.start()
        outcome["elapsed"] = time.monotonic() - began

    with caplog.at_level(logging.WARNING), stopped_process(shim):
        thread = threading.Thread(target=boot, daemon=True)
        thread.start()
        thread.join(timeout=BOUND + 4 * CALL_TIMEOUT + SLACK)
        assert not thread.is_alive(), f"start-up still sweeping after {BOUND + SLACK:.0f}s"
    assert outcome["ok"] and agent.ready.is_set()
    # The sweep's listing + one teardown bound + re-adopt's task listing, with slack.
    assert outcome["elapsed"] < BOUND + 2 * CALL_TIMEOUT + SLACK, outcome
    lease = Leases(kube, namespace).get(node)
    assert lease is not None and lease.renew_time is not None
    assert any(
        "orphan-wedged" in r.getMessage() and "kill wait" in r.getMessage() for r in caplog.records
    )
    assert (
        agent.registry.get_sample_value(
            "sandlot_agent_teardowns_total", {"outcome": "kill_wait_timeout"}
        )
        == 1
    )
    print(f"start-up with a wedged shim: {outcome['elapsed']:.2f}s (bound {BOUND:.0f}s)")


def test_twenty_wedged_shims_with_concurrency_eight_take_about_three_bounds(
    rt, containerd: PrivateContainerd
) -> None:
    kill_wait, call = 1.0, 1.0
    bound = kill_wait + 4 * call
    ids = [f"wedge-{i:02d}" for i in range(20)]
    shims = [find_shim_pid(containerd.address, c, start_container(rt, c, {})) for c in ids]
    with contextlib.ExitStack() as stack:
        for shim in shims:
            stack.enter_context(stopped_process(shim))
        began = time.monotonic()
        results = teardown_many(rt, ids, kill_wait=kill_wait, call_timeout=call, concurrency=8)
        elapsed = time.monotonic() - began
    assert {r.outcome for r in results} == {TeardownOutcome.KILL_WAIT_TIMEOUT}
    assert elapsed < 3 * bound + SLACK, f"{elapsed:.1f}s for 20 wedged shims (bound {bound:g}s)"
    print(f"20 wedged shims, concurrency 8: {elapsed:.2f}s = {elapsed / bound:.2f} bounds")


def test_reaper_tears_down_an_exited_container_and_records_its_exit_code(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, rt
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "short", node, command=["sh", "-c", "sleep 1; exit 7"])
    container = wait_phase(kube, namespace, "short", "Running")["status"]["containerId"]
    status = wait_phase(kube, namespace, "short", "Stopped", timeout=20)["status"]
    assert status["exitCode"] == 7 and status["reason"] == "Exited"
    wait_for(
        lambda: container not in container_ids(rt),
        timeout=10,
        what=f"reaped container {container} to be gone",
    )
    assert (agent.registry.get_sample_value("sandlot_agent_reaper_passes_total") or 0) >= 1


def test_missing_image_fails_the_sandbox_naming_the_image(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str
) -> None:
    agent = make_agent()
    assert agent.start()
    image = "docker.io/sandlot/not-on-this-node:9"
    # Not on the node and not to be pulled (pulls have tests of their own).
    create_sandbox(kube, namespace, "noimage", node, image=image, pull_policy="Never")
    status = wait_phase(kube, namespace, "noimage", "Failed")["status"]
    assert status["reason"] == "ImageNotFound"
    assert image in status["message"]


def test_drained_node_stops_its_sandboxes_with_their_exit_code(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, rt
) -> None:
    agent = make_agent()
    assert agent.start()
    create_sandbox(kube, namespace, "drainme", node)
    container = wait_phase(kube, namespace, "drainme", "Running")["status"]["containerId"]
    _custom(kube).patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", node, {"spec": {"unschedulable": True}}
    )
    status = wait_phase(kube, namespace, "drainme", "Stopped", timeout=20)["status"]
    assert status["reason"] == "Drained" and status["exitCode"] == 143  # its SIGTERM trap
    assert container not in container_ids(rt)


def test_sandboxnode_status_is_registered(
    make_agent: AgentFactory, kube: client.ApiClient, node: str
) -> None:
    agent = make_agent(capacity=7)
    assert agent.start()
    obj = _custom(kube).get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)
    status = obj["status"]
    assert status["capacity"]["sandboxes"] == 7
    assert status["address"] == "10.1.2.3"
    assert status["containerdVersion"] and status["agentVersion"]


def test_sandboxnode_counts_its_non_terminal_sandboxes_for_kubectl(
    make_agent: AgentFactory, kube: client.ApiClient, namespace: str, node: str, kubectl
) -> None:
    agent = make_agent()
    assert agent.start()
    for name in ("one", "two", "three"):
        create_sandbox(kube, namespace, name, node)
    for name in ("one", "two", "three"):
        wait_phase(kube, namespace, name, "Running")
    _custom(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "three", {"status": {"phase": "Stopped"}}
    )

    def shown() -> str | None:
        out = kubectl("get", "snode", node, "--no-headers").stdout.split()
        return out[2] if out[2] == "2" else None  # NAME PHASE SANDBOXES AGE

    wait_for(shown, timeout=15, what=f"kubectl get snode {node} to show 2 sandboxes")


def test_cacheprune_all_runs_the_forced_pass_and_records_it(
    make_agent: AgentFactory, kube: client.ApiClient, node: str, rt
) -> None:
    agent = make_agent(gc_interval="1h")  # no automatic pass overwrites status.gc meanwhile
    assert agent.start()
    name = f"prune-{uuid.uuid4().hex[:6]}"
    _custom(kube).create_cluster_custom_object(
        GROUP,
        VERSION,
        "cacheprunes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "CachePrune",
            "metadata": {"name": name},
            "spec": {"all": True, "nodes": [node]},
        },
    )

    def result() -> dict[str, Any] | None:
        obj = _custom(kube).get_cluster_custom_object(GROUP, VERSION, "cacheprunes", name)
        return ((obj.get("status") or {}).get("results") or {}).get(node)

    entry = wait_for(result, timeout=20, what=f"CachePrune {name} result for {node}")
    assert entry["pass"] == "forced" and entry.get("error") is None
    assert entry["recordsRemoved"] == 1  # the unused busybox image: nothing protects it
    assert IMAGE not in {r.name for r in rt.list_images(timeout=10)}
    gc = _custom(kube).get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)["status"][
        "gc"
    ]
    assert gc["lastPassKind"] == "forced" and gc["recordsRemoved"] == 1
