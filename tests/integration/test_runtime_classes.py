"""What the agent refuses of a sandbox's RuntimeClass, claimed against a real agent,
kube-apiserver and containerd: a handler its node does not offer
(RuntimeHandlerUnknown, naming the handler and what the node offers), a class that
does not exist (RuntimeClassNotFound), a class it cannot honour (InvalidRuntimeClass:
an overhead in a resource it does not count), and a class whose overhead does not
fit beside the sandbox's limits (OverCapacity). None of them gets a container.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.api.reasons import SandboxReason
from sandlot.devtools.containerd import PrivateContainerd
from tests.support.runtimeclasses import HandlerRig, runtime_class

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

SLEEP = "sleep 1000"


def _refused(rig: HandlerRig, containerd: PrivateContainerd, name: str) -> dict[str, str]:
    status: dict[str, str] = rig.wait(name, "Failed")["status"]
    rt = ContainerdRuntime(containerd.address, rig.ctr_ns)
    try:
        uid = rig.get(name)["metadata"]["uid"]
        assert not [c for c in rt.list_containers(timeout=10) if uid in c.id], status
    finally:
        rt.close()
    return status


def test_a_handler_the_node_lacks_is_refused_naming_it(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    with runtime_class(handler_rig.kube, "kata") as kata:
        name = handler_rig.run(SLEEP, runtimeClassName=kata)
        status = _refused(handler_rig, containerd, name)
    assert status["reason"] == SandboxReason.RUNTIME_HANDLER_UNKNOWN, status
    assert '"kata"' in status["message"] and "crun, runc" in status["message"], status


def test_a_missing_class_is_refused(handler_rig: HandlerRig, containerd: PrivateContainerd) -> None:
    name = handler_rig.run(SLEEP, runtimeClassName="no-such-class")
    status = _refused(handler_rig, containerd, name)
    assert status["reason"] == SandboxReason.RUNTIME_CLASS_NOT_FOUND, status
    assert "no-such-class" in status["message"], status


def test_a_class_with_an_overhead_sandlot_cannot_count_is_refused(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    overhead = {"podFixed": {"memory": "10Mi", "example.com/widget": "1"}}
    with runtime_class(handler_rig.kube, "crun", overhead=overhead) as widget:
        name = handler_rig.run(SLEEP, runtimeClassName=widget)
        status = _refused(handler_rig, containerd, name)
    assert status["reason"] == SandboxReason.INVALID_RUNTIME_CLASS, status
    assert "example.com/widget" in status["message"], status


def test_the_class_overhead_counts_in_the_node_capacity(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    """The rig's node holds 1Gi: a 600Mi sandbox fits alone, not with 600Mi of overhead."""
    limits: dict[str, Any] = {"resources": {"limits": {"memory": "600Mi"}}}
    with runtime_class(handler_rig.kube, "crun", overhead={"podFixed": {"memory": "600Mi"}}) as rc:
        heavy = handler_rig.run(SLEEP, runtimeClassName=rc, **limits)
        status = _refused(handler_rig, containerd, heavy)
        assert status["reason"] == SandboxReason.OVER_CAPACITY, status
        light = handler_rig.run(SLEEP, **limits)
        handler_rig.wait(light, "Running")
