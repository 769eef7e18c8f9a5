"""Lifetimes end to end: a real ``sandlot operator`` ends a sandbox at its
``shutdownTime`` or ``activeDeadlineSeconds`` (Stopped, DeadlineExceeded) to the
second, and the node's real agent stops its container."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import parse_time, rfc3339
from tests.support.pools import IMAGE, SLEEPER, Cluster, Start, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def create(c: Cluster, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "image": IMAGE,
            "command": SLEEPER,
            "terminationGracePeriodSeconds": 1,
            **spec,
        },
    }
    c.objs.create_namespaced_custom_object(GROUP, VERSION, c.namespace, "sandboxes", body)


def get(c: Cluster, name: str) -> dict[str, Any]:
    return dict(c.objs.get_namespaced_custom_object(GROUP, VERSION, c.namespace, "sandboxes", name))


def wait_phase(c: Cluster, name: str, phase: str, timeout: float = 40) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = get(c, name)
        return sb if (sb.get("status") or {}).get("phase") == phase else None

    return wait_for(probe, timeout=timeout, what=f"sandbox {name} to be {phase}")


def test_shutdown_time_stops_a_running_sandbox_at_that_second_and_its_container(
    cluster: Cluster, operators: Start, kubectl
) -> None:
    node = cluster.add_node("a")
    start_operator(cluster, operators)
    deadline = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
    create(cluster, "timed", shutdownTime=rfc3339(deadline).replace(".000000", ""))
    running = wait_phase(cluster, "timed", "Running")
    container = running["status"]["containerId"]
    assert container in node.containers()

    out = kubectl("get", "sb", "timed", "-n", cluster.namespace, "-o", "wide").stdout
    header, row = out.splitlines()[:2]
    assert "SHUTDOWN-TIME" in header and rfc3339(deadline, "seconds") in row, out

    status = wait_phase(cluster, "timed", "Stopped", timeout=30)["status"]
    assert status["reason"] == "DeadlineExceeded", status
    finished = parse_time(status["finishedAt"])
    assert finished is not None
    late = (finished - deadline).total_seconds()
    assert 0 <= late < 1.0, f"ended {late:.3f}s after its shutdownTime"
    wait_for(
        lambda: container not in node.containers(),
        timeout=15,
        what=f"the agent to stop container {container}",
    )


def test_active_deadline_counts_from_creation(cluster: Cluster, operators: Start) -> None:
    cluster.add_node("a")
    start_operator(cluster, operators)
    name = f"short-{uuid.uuid4().hex[:4]}"
    create(cluster, name, activeDeadlineSeconds=6)
    created = parse_time(get(cluster, name)["metadata"]["creationTimestamp"])
    assert created is not None
    status = wait_phase(cluster, name, "Stopped", timeout=30)["status"]
    assert status["reason"] == "DeadlineExceeded", status
    finished = parse_time(status["finishedAt"])
    assert finished is not None
    late = (finished - (created + timedelta(seconds=6))).total_seconds()
    assert 0 <= late < 1.0, f"ended {late:.3f}s after creation + activeDeadlineSeconds"


def test_shutdown_time_must_be_rfc3339(cluster: Cluster) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as refused:
        create(cluster, "badtime", shutdownTime="tomorrow at noon")
    assert refused.value.status == 422 and "shutdownTime" in str(refused.value.body)


def wait_gone(c: Cluster, name: str, timeout: float) -> None:
    from kubernetes.client.exceptions import ApiException

    def gone() -> bool:
        try:
            get(c, name)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_for(gone, timeout=timeout, what=f"sandbox {name} to be deleted")


def test_delete_policy_deletes_the_sandbox_at_its_deadline_and_its_container_stops(
    cluster: Cluster, operators: Start
) -> None:
    node = cluster.add_node("a")
    start_operator(cluster, operators)
    create(cluster, "doomed", activeDeadlineSeconds=20, shutdownPolicy="Delete")
    container = wait_phase(cluster, "doomed", "Running")["status"]["containerId"]
    wait_gone(cluster, "doomed", timeout=60)
    wait_for(
        lambda: container not in node.containers(),
        timeout=30,
        what=f"the agent to stop container {container}",
    )


def test_retain_keeps_it_stopped_then_ttl_deletes_it_after_finished_at(
    cluster: Cluster, operators: Start
) -> None:
    cluster.add_node("a")
    start_operator(cluster, operators)
    create(cluster, "kept", activeDeadlineSeconds=5, ttlSecondsAfterFinished=6)
    status = wait_phase(cluster, "kept", "Stopped", timeout=40)["status"]
    assert status["reason"] == "DeadlineExceeded", status
    assert get(cluster, "kept")["spec"]["shutdownPolicy"] == "Retain"
    wait_gone(cluster, "kept", timeout=60)


def test_shutdown_policy_must_be_retain_or_delete(cluster: Cluster) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as refused:
        create(cluster, "badpolicy", shutdownPolicy="Explode")
    assert refused.value.status == 422 and "shutdownPolicy" in str(refused.value.body)
