"""The status writes' lean path (``adapters.mergepatch``) against the real API
server: the same answers as the generated client, the write fence before every
write, and the credentials read once per refresh interval."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import NotLeader, RequestCounter, WriteFence, load_api_client
from sandlot.adapters.mergepatch import AUTH_REFRESH, MergePatcher
from sandlot.adapters.nodeguard import namespace_metadata
from sandlot.adapters.objects import Objects
from sandlot.devtools.controlplane import ControlPlane
from tests.support.clock import FakeClock
from tests.support.operator import Fleet

pytestmark = pytest.mark.integration


def status_path(fleet: Fleet, name: str) -> tuple[str, ...]:
    return ("apis", "sandlot.dev", "v1alpha1", "namespaces", fleet.namespace, "sandboxes",
            name, "status")  # fmt: skip


def test_a_merge_patch_keeps_spec_and_returns_the_object(
    kube: client.ApiClient, fleet: Fleet
) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Scheduled", hostNetwork=True)
    before = fleet.get("box")

    written = Objects(kube).patch_sandbox_status(
        fleet.namespace, "box", {"phase": "Running"}, before["metadata"]["resourceVersion"]
    )

    assert written["status"]["phase"] == "Running"
    assert written["metadata"]["resourceVersion"] == fleet.get("box")["metadata"]["resourceVersion"]
    assert fleet.get("box")["spec"] == before["spec"], "a status write changed spec"


def test_a_stale_resource_version_is_a_409_and_changes_nothing(
    kube: client.ApiClient, fleet: Fleet
) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Scheduled")
    old = fleet.get("box")["metadata"]["resourceVersion"]
    fleet.set_phase("box", "Running")

    with pytest.raises(ApiException) as raised:
        Objects(kube).patch_sandbox_status(fleet.namespace, "box", {"phase": "Dead"}, old)

    assert raised.value.status == 409
    assert fleet.phase("box") == "Running"


def test_a_missing_sandbox_is_a_404(kube: client.ApiClient, fleet: Fleet) -> None:
    with pytest.raises(ApiException) as raised:
        Objects(kube).patch_sandbox_status(fleet.namespace, "nobody", {"phase": "Dead"})
    assert raised.value.status == 404


def test_a_fenced_client_refuses_the_write_before_sending_it(
    control_plane: ControlPlane, fleet: Fleet
) -> None:
    node = fleet.node("n1", lease=False)
    fleet.sandbox("box", node, "Running")
    counter = RequestCounter()
    api = load_api_client(
        str(control_plane.kubeconfig), counter=counter, fence=WriteFence(lambda: False)
    )
    try:
        with pytest.raises(NotLeader, match="refused PATCH"):
            Objects(api).patch_sandbox_status(fleet.namespace, "box", {"phase": "Dead"})
    finally:
        api.close()
    assert counter.total() == 0, "the refused write reached the API server"
    assert fleet.phase("box") == "Running"


def test_credentials_are_read_once_per_refresh_interval(
    control_plane: ControlPlane, fleet: Fleet
) -> None:
    node = fleet.node("n1", lease=False)
    names = [fleet.sandbox(f"box{i}", node, "Scheduled") for i in range(4)]
    api = load_api_client(str(control_plane.kubeconfig))
    reads: list[float] = []
    clock = FakeClock()

    def refresh(cfg: Any) -> None:
        reads.append(clock.monotonic())
        if len(reads) == 2:  # the credentials changed since the first read
            cfg.api_key["BearerToken"] = cfg.api_key["authorization"] = "Bearer not-a-token"

    api.configuration.refresh_api_key_hook = refresh
    patcher = MergePatcher(api, clock=clock.monotonic)
    try:
        for name in names:
            patcher.patch(*status_path(fleet, name), body={"status": {"phase": "Running"}})
        assert len(reads) == 1, "the credentials were read again within the refresh interval"
        clock.advance(AUTH_REFRESH)
        with pytest.raises(ApiException) as raised:
            patcher.patch(*status_path(fleet, names[0]), body={"status": {"phase": "Dead"}})
    finally:
        api.close()
    assert len(reads) == 2
    assert raised.value.status == 401, "the write did not carry the credentials read afresh"
    assert {fleet.phase(n) for n in names} == {"Running"}


def test_a_lean_read_gives_the_namespaces_labels_and_annotations(
    kube: client.ApiClient, fleet: Fleet
) -> None:
    """A start's one read of its namespace (``nodeguard.namespace_metadata``) on the
    lean path: what the generated client reads, and a missing one is its 404."""
    core = client.CoreV1Api(kube)
    body = {"labels": {"example.com/read": "lean"}, "annotations": {"a": "b"}}
    core.patch_namespace(fleet.namespace, {"metadata": body})
    patcher = Objects(kube).patcher

    labels, annotations = namespace_metadata(patcher, fleet.namespace)

    generated = core.read_namespace(fleet.namespace).metadata
    assert generated is not None
    assert (labels, annotations) == (generated.labels, generated.annotations)
    assert labels["example.com/read"] == "lean" and annotations["a"] == "b"
    with pytest.raises(ApiException) as raised:
        namespace_metadata(patcher, f"{fleet.namespace}-none")
    assert raised.value.status == 404
