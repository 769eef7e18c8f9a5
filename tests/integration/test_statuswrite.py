"""The guarded status write against the real API server: its 409 on a stale
resourceVersion, a Sandbox deleted and created again under the same name, and the
CEL rule that keeps a terminal phase terminal."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.objects import Objects
from sandlot.adapters.statuswrite import WriteOutcome, write_status
from sandlot.api.common import GROUP, VERSION
from sandlot.api.sandbox import SandboxPhase
from tests.support.operator import Fleet

pytestmark = pytest.mark.integration

RUNNING = {"phase": "Running", "reason": "Started", "containerId": "sb-x", "pid": 7}


def delete(fleet: Fleet, name: str) -> None:
    fleet.objs.delete_namespaced_custom_object(GROUP, VERSION, fleet.namespace, "sandboxes", name)


def relabel(fleet: Fleet, name: str) -> None:
    fleet.objs.patch_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxes", name, {"metadata": {"labels": {"t": "1"}}}
    )


def stale(kube: client.ApiClient, fleet: Fleet, name: str) -> tuple[Objects, dict[str, Any]]:
    objects = Objects(kube)
    return objects, objects.get_sandbox(fleet.namespace, name)


def test_stale_version_rereads_and_writes(kube: client.ApiClient, fleet: Fleet) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Scheduled")
    objects, old = stale(kube, fleet, "box")
    relabel(fleet, "box")

    result = write_status(objects, old, RUNNING, node=node)

    assert result.outcome is WriteOutcome.WRITTEN, result
    assert fleet.phase("box") == "Running"


def test_sandbox_recreated_under_the_same_name_is_gone_and_left_alone(
    kube: client.ApiClient, fleet: Fleet
) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Scheduled")
    objects, old = stale(kube, fleet, "box")
    delete(fleet, "box")
    fleet.sandbox("box", node, "Scheduled")
    assert fleet.get("box")["metadata"]["uid"] != old["metadata"]["uid"]  # premise

    result = write_status(objects, old, RUNNING, node=node)

    assert result.outcome is WriteOutcome.GONE, result
    assert fleet.phase("box") == "Scheduled", "the new Sandbox got the old one's status"


def test_deleted_sandbox_is_gone(kube: client.ApiClient, fleet: Fleet) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Running")
    objects, old = stale(kube, fleet, "box")
    delete(fleet, "box")

    assert write_status(objects, old, RUNNING, node=node).outcome is WriteOutcome.GONE


def test_terminal_on_reread_is_skipped_and_kept(kube: client.ApiClient, fleet: Fleet) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Running")
    objects, old = stale(kube, fleet, "box")
    fleet.set_phase("box", "Stopped", reason="Exited", exitCode=3)

    result = write_status(objects, old, {"phase": "Dead", "reason": "NodeLost"}, node=node)

    assert result.outcome is WriteOutcome.SKIPPED, result
    assert fleet.get("box")["status"]["reason"] == "Exited"


def test_phase_outside_allowed_from_on_reread_is_skipped(
    kube: client.ApiClient, fleet: Fleet
) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Scheduled")
    objects, old = stale(kube, fleet, "box")
    fleet.set_phase("box", "Running", reason="Started")
    drained = {"phase": "Stopped", "reason": "Drained"}

    result = write_status(
        objects,
        old,
        drained,
        node=node,
        allowed_from={SandboxPhase.PENDING, SandboxPhase.SCHEDULED},
    )

    assert result.outcome is WriteOutcome.SKIPPED, result
    assert fleet.phase("box") == "Running"
