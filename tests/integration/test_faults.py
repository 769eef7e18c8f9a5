"""Faults injected for real: etcd and kube-apiserver stopped under a running
operator, containerd restarted under a running agent, and bad input refused with
a message naming the problem."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.api import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from tests.support.agents import agent_settings
from tests.support.containerd import start_private_containerd, unavailable_reason
from tests.support.kube import start_private_plane
from tests.support.operator import Fleet, OperatorProcess
from tests.support.passes import node_passes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")


def _unless_5xx(read: Callable[[], T]) -> T | None:
    """What ``read`` returns, or None when the API server answers 5xx: after etcd
    restarts, the API server times requests out until its etcd client reconnects."""
    try:
        return read()
    except client.ApiException as e:
        if e.status is not None and e.status >= 500:
            return None
        raise


def _fleet(plane: ControlPlane) -> tuple[client.ApiClient, Fleet]:
    api = load_api_client(str(plane.kubeconfig), pool_size=32)
    return api, Fleet(api, "work", "sandlot-system")


HOLD_LABEL = "faults.sandlot.test/hold"
# Requests the API server failed, as the operator counts them (verb, resource, code).
API_FAILURES = "sandlot_operator_api_failures_total"


def _hold_dead_marks(api: client.ApiClient, fleet: Fleet, probe_node: str) -> Callable[[], None]:
    """Make the API server refuse ``Dead`` for sandboxes labelled ``HOLD_LABEL`` (a
    ValidatingAdmissionPolicy), so a marking pass stops part-way for as long as the
    test wants; returns what removes the policy. Waits until a probe is refused."""
    adm: Any = client.AdmissionregistrationV1Api(api)
    name = f"hold-dead-{fleet.prefix}"
    adm.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": ["*"],
                            "operations": ["UPDATE"],
                            "resources": ["sandboxes/status"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"!has(object.metadata.labels) || !('{HOLD_LABEL}' in "
                        "object.metadata.labels) || !has(object.status.phase) || "
                        "object.status.phase != 'Dead'",
                        "message": "held Dead mark (fault test)",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }
    )
    attempt = iter(range(10_000))

    def refused() -> bool:
        probe = fleet.sandbox(f"probe{next(attempt)}", probe_node, "Running")
        _label(fleet, probe)
        try:
            fleet.set_phase(probe, "Dead")
        except client.ApiException as exc:
            return exc.status in (403, 422)
        return False  # not in force yet: this probe is spent, try a fresh one

    wait_for(refused, timeout=30, interval=0.2, what="the hold policy to refuse a Dead mark")

    def remove() -> None:
        adm.delete_validating_admission_policy_binding(name)
        adm.delete_validating_admission_policy(name)

    return remove


def _label(fleet: Fleet, name: str) -> None:
    fleet.objs.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        fleet.namespace,
        "sandboxes",
        name,
        {"metadata": {"labels": {HOLD_LABEL: "true"}}},
    )


def test_etcd_restarted_in_the_middle_of_a_reap(tmp_path: Path):
    # The API server gives up on a request after 3 s (not the default minute), so
    # with etcd stopped the operator's marking pass is answered 504 while the
    # outage lasts, instead of waiting on it past its own client timeout.
    plane = start_private_plane(
        tmp_path / "cp", extra_flags=["--request-timeout=3s"], namespaces=("work", "sandlot-system")
    )
    api, fleet = _fleet(plane)
    op: OperatorProcess | None = None
    try:
        lost, healthy = fleet.node("lost"), fleet.node("healthy")
        lost_lease = fleet.lease(lost, duration=2)
        fleet.lease(healthy, duration=15)
        lost_names = [fleet.sandbox(f"l{i}", lost, "Running") for i in range(150)]
        held = lost_names[::15]
        for name in held:
            _label(fleet, name)
        healthy_names = [fleet.sandbox(f"h{i}", healthy, "Running") for i in range(10)]
        release = _hold_dead_marks(api, fleet, healthy)
        op = OperatorProcess(
            plane,
            tmp_path,
            "sandlot-system",
            "--grace-period",
            "2s",
            "--resync-interval",
            "1s",
            "--mark-concurrency",
            "4",
        )
        op.wait_metrics()
        wait_for(
            lambda: fleet.get_node(lost).get("status", {}).get("phase") == "Ready",
            timeout=20,
            what="lost node Ready first",
        )
        lost_lease.pause()
        lost_lease.stop()
        marked = "sandlot_operator_sandboxes_marked_dead_total"
        wait_for(lambda: op.metric(marked) >= 1, timeout=30, interval=0.1, what="marking started")
        # The marking runs until only the held sandboxes are left, and keeps retrying
        # them (each retry refused by the hold policy): marks are in flight, none lands.
        free = len(lost_names) - len(held)
        wait_for(
            lambda: op.metric(marked) >= free,
            timeout=60,
            interval=0.1,
            what=f"the {free} sandboxes not held marked Dead",
        )
        wait_for(
            lambda: op.metric("sandlot_operator_mark_failures_total") >= 2 * len(held),
            timeout=30,
            interval=0.1,
            what="the held sandboxes' marks retried after a refusal",
        )
        assert [fleet.phase(n) for n in held] == ["Running"] * len(held), (
            "a held sandbox was marked: the fault below would not hit mid-marking"
        )
        assert not fleet.health(lost).get("handledAt"), "latch set on a partial marking"

        # A 5xx counted by the operator after the stop is etcd's outage answering its
        # marking pass (the hold's refusals are 403/422, never counted as failures).
        def server_errors() -> float:
            """5xx answers the operator got, to any request of its passes."""
            return op.metric(API_FAILURES) - op.metric(API_FAILURES, code="none")

        before_stop = server_errors()
        plane.stop_etcd()

        def server_error() -> bool:
            return server_errors() > before_stop

        wait_for(
            server_error,
            timeout=45,
            interval=0.5,
            what="the operator's marking pass answered 5xx with etcd stopped",
        )
        plane.restart_etcd()

        def held_and_latch() -> tuple[list[str | None], dict[str, Any]] | None:
            """The held sandboxes' phases and the lost node's health, once the API
            server answers them; None while it still answers 5xx (its etcd client
            reconnecting)."""
            return _unless_5xx(lambda: ([fleet.phase(n) for n in held], fleet.health(lost)))

        phases, health = wait_for(held_and_latch, timeout=30, what="the API server back")
        assert not health.get("handledAt"), "latch set while marks were failing"
        assert phases == ["Running"] * len(held), "a held mark landed"
        release()

        def all_dead() -> bool | None:
            return _unless_5xx(lambda: all(fleet.phase(n) == "Dead" for n in lost_names))

        wait_for(all_dead, timeout=90, interval=0.5, what="every sandbox of the lost node Dead")
        wait_for(
            lambda: _unless_5xx(lambda: fleet.health(lost).get("handledAt")),
            timeout=30,
            what="latch set",
        )
        assert op.metric(marked) >= len(lost_names)
        assert all(fleet.phase(n) == "Running" for n in healthy_names), (
            "a sandbox on the healthy node was touched"
        )
        assert op.proc.poll() is None, f"the operator died:\n{op.log()}"
    finally:
        if op is not None:
            op.stop()
        fleet.cleanup()
        api.close()
        plane.stop()


def test_api_server_away_longer_than_the_lease_marks_nothing_dead(
    own_plane: ControlPlane, tmp_path: Path
):
    api, fleet = _fleet(own_plane)
    # Fewer nodes than the guard needs: the mass-failure guard is off, and only the
    # liveness judgement (observed renewals, a view restored after the outage) holds.
    nodes = [fleet.node(f"n{i}") for i in range(2)]
    # Lease + grace (7 s) below the lease view's 45 s staleness bound: an outage
    # long enough to pass every deadline is not long enough to make the view stale,
    # so only the failed watch itself can stop the operator reaping on it.
    for n in nodes:
        fleet.lease(n, duration=5)
    names = [fleet.sandbox(f"s{i}", n, "Running") for i, n in enumerate(nodes)]
    op = OperatorProcess(
        own_plane,
        tmp_path,
        "sandlot-system",
        "--grace-period",
        "2s",
        "--resync-interval",
        "1s",
        "--min-nodes-for-guard",
        "3",
    )
    try:
        op.wait_metrics()
        for n in nodes:
            wait_for(
                partial(lambda n: fleet.get_node(n).get("status", {}).get("phase") == "Ready", n),
                timeout=20,
                what=f"{n} Ready",
            )
        own_plane.stop_apiserver()
        # The outage itself, not a wait for anything: longer than lease + grace, so
        # every lease the operator last saw has expired by its clock.
        time.sleep(5 + 2 + 2)
        own_plane.restart_apiserver()
        at_restart = node_passes(op)
        # The agents renew again as soon as the API server is back (AgentLease keeps
        # trying); the operator must judge READY from those renewals.
        for n in nodes:
            wait_for(
                partial(lambda n: fleet.get_node(n).get("status", {}).get("phase") == "Ready", n),
                timeout=30,
                what=f"{n} Ready again",
            )

        def nothing_dead() -> None:
            if phases := [p for p in map(fleet.phase, names) if p != "Running"]:
                pytest.fail(f"the operator marked sandboxes {phases} after its own outage")

        # It looked: a pass per node per second of lease + grace after the restart,
        # the window in which a stale view would have reaped (each pass resyncs).
        looked = len(nodes) * (5 + 2 + 1)

        def looked_and_nothing_dead() -> bool:
            nothing_dead()
            return node_passes(op) >= at_restart + looked

        wait_for(
            looked_and_nothing_dead,
            timeout=60,
            interval=0.2,
            what=f"{looked} node-health passes after the restart (from {at_restart})",
        )
        nothing_dead()
        assert op.proc.poll() is None, f"the operator died:\n{op.log()}"
    finally:
        op.stop()
        fleet.cleanup()
        api.close()


@pytest.mark.containerd
def test_containerd_restarted_under_the_agent_readopts_and_tears_nothing_down(
    kube: client.ApiClient, namespace: str, tmp_path: Path
):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    ctrd = start_private_containerd()
    ns = f"agent-{uuid.uuid4().hex[:6]}"
    archive = tmp_path / "busybox.tar"
    image = "docker.io/sandlot/fault-busybox:1"
    build_image_archive(archive, image)
    import_archive(ctrd.address, ns, archive, timeout=60)
    node = f"node-{uuid.uuid4().hex[:6]}"
    settings = agent_settings(
        node=node,
        namespace=namespace,
        containerd=ctrd,
        ctr_ns=ns,
        log_dir=tmp_path / "logs",
        resync_interval="1s",  # an idle node still passes every second
    )
    agent = Agent(settings, kube, registry=CollectorRegistry())
    syncs = agent.metrics.sync_passes  # passes that got through (each lists containerd)
    objs: Any = client.CustomObjectsApi(kube)

    def create(name: str) -> None:
        objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": name},
                "spec": {
                    "image": image,
                    "nodeName": node,
                    "command": ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait'],
                },
            },
        )

    def running(name: str) -> dict[str, Any] | None:
        sb = objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)
        status = sb.get("status") or {}
        return status if status.get("phase") == "Running" else None

    try:
        assert agent.start()
        create("keep")
        before = wait_for(lambda: running("keep"), timeout=30, what="the sandbox Running")
        ctrd.restart()
        # Passes that got through after the restart talked to the new containerd: the
        # agent reconnected, and its plan saw the old container again.
        restarted_at = syncs._value.get()
        wait_for(
            lambda: syncs._value.get() >= restarted_at + 3,
            timeout=30,
            what="3 sync passes through the restarted containerd",
        )
        create("fresh")
        fresh = wait_for(
            lambda: running("fresh"), timeout=30, what="a new sandbox Running after the restart"
        )
        assert fresh["containerId"] != before["containerId"]
        after = running("keep")
        assert after is not None, "the sandbox left Running across a containerd restart"
        assert after["pid"] == before["pid"] and after["containerId"] == before["containerId"]
        rt = ContainerdRuntime(ctrd.address, ns)
        try:
            task = rt.get_task(before["containerId"], timeout=5)
        finally:
            rt.close()
        assert task is not None and task.pid == before["pid"], "the container was torn down"
        teardowns = sum(
            agent.registry.get_sample_value("sandlot_agent_teardowns_total", {"outcome": o}) or 0
            for o in ("clean", "kill_wait_timeout", "error")
        )
        assert teardowns == 0, f"{teardowns} containers torn down across the restart"
    finally:
        agent.shutdown()
        ctrd.stop()
        ctrd.remove()


def _sandlot(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["agent", "--node-name", "n1", "--gc-low", "90", "--gc-high", "85"], "gc_low"),
        (["agent", "--node-name", "n1", "--renew-interval", "90s"], "renew"),
        (["operator", "--grace-period", "soon"], "--grace-period"),
        (["operator", "--disruption-threshold", "1.5"], "--disruption-threshold"),
    ],
    ids=[
        "gc-low-above-high",
        "renew-longer-than-lease",
        "grace-not-a-duration",
        "threshold-over-1",
    ],
)
def test_bad_settings_are_refused_at_start_naming_the_setting(args, words):
    proc = _sandlot(*args)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_kubeconfig_is_refused_naming_the_file(tmp_path: Path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: [this is: not valid\n")
    proc = _sandlot("operator", "--kubeconfig", str(bad), "--metrics-port", "0")
    assert proc.returncode == 2, proc.stderr
    assert str(bad) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_sandbox_naming_a_node_that_does_not_exist_says_so_and_waits(fleet, operators):
    fleet.lease(fleet.node("real"))
    fleet.sandbox("lost-soul", "ghost-node", None)
    operators("--grace-period", "3s", "--resync-interval", "1s")

    def condition() -> dict[str, Any] | None:
        conds = (fleet.get("lost-soul").get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Scheduled"), None)

    cond = wait_for(condition, timeout=20, what="the sandbox's Scheduled condition")
    assert (cond["status"], cond["reason"]) == ("False", "NodeNotFound")
    assert '"ghost-node"' in cond["message"] and "does not exist" in cond["message"]
    sb = fleet.get("lost-soul")
    assert sb["spec"]["nodeName"] == "ghost-node", "the sandbox's spec was changed"
    assert (sb.get("status") or {}).get("phase", "Pending") == "Pending"
