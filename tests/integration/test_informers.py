"""The operator's lean informers against the real API server: a list in pages, then
every change through the watch, as JSON."""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.informer import LeaseInformer, SandboxInformer
from sandlot.adapters.objects import LeaseRecord
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import AGENT_LEASE_LABEL

pytestmark = pytest.mark.integration

WAIT = 30.0  # seconds an event may take to arrive


def sandbox(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "example.test/busybox:1"},
    }


def next_of(
    events: queue.Queue[tuple[str, Mapping[str, Any]]], namespace: str, name: str
) -> tuple[str, Mapping[str, Any]]:
    """The next event about ``namespace/name`` (others' are passed over), bounded."""
    deadline = time.monotonic() + WAIT
    while (left := deadline - time.monotonic()) > 0:
        try:
            kind, body = events.get(timeout=left)
        except queue.Empty:
            break
        meta = body["metadata"]
        if (meta.get("namespace"), meta["name"]) == (namespace, name):
            return kind, body
    raise AssertionError(f"no event about {namespace}/{name} within {WAIT:.0f}s")


def test_the_sandbox_informer_lists_in_pages_then_delivers_every_change(kube, namespace):
    objs: Any = client.CustomObjectsApi(kube)
    for i in range(5):
        objs.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", sandbox(f"s{i}")
        )
    events: queue.Queue[tuple[str, Mapping[str, Any]]] = queue.Queue()
    listed: list[set[str]] = []
    informer = SandboxInformer(
        kube, lambda kind, body: events.put((kind, body)), listed.append, page=2, watch_timeout=60
    )
    informer.start()
    try:
        assert informer.synced.wait(WAIT), f"the first list did not end within {WAIT:.0f}s"
        ours = {k for k in listed[0] if k.startswith(f"{namespace}/")}
        assert ours == {f"{namespace}/s{i}" for i in range(5)}, "pages lost or repeated objects"
        for i in range(5):
            kind, body = next_of(events, namespace, f"s{i}")
            assert kind == "SYNC" and body["spec"]["image"] == "example.test/busybox:1"

        objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", sandbox("s5"))
        assert next_of(events, namespace, "s5")[0] == "ADDED"
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "sandboxes", "s0", {"status": {"phase": "Running"}}
        )
        kind, body = next_of(events, namespace, "s0")
        assert (kind, body["status"]["phase"]) == ("MODIFIED", "Running")
        objs.delete_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", "s1")
        assert next_of(events, namespace, "s1")[0] == "DELETED"
    finally:
        stopping = time.monotonic()
        informer.stop(timeout=WAIT)
        took = time.monotonic() - stopping
    assert not informer._thread.is_alive(), "the informer's thread outlived stop()"
    assert took < 10, f"stop() waited {took:.1f}s: it did not interrupt the watch"


def test_the_lease_informer_lists_without_losing_a_lease_then_sees_one_deleted(kube, namespace):
    leases: Any = client.CoordinationV1Api(kube)  # bodies as plain JSON
    for name in ("n1", "n2"):
        leases.create_namespaced_lease(
            namespace,
            {
                "metadata": {"name": name, "labels": {AGENT_LEASE_LABEL: "true"}},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 10},
            },
        )
    events: queue.Queue[tuple[str, LeaseRecord]] = queue.Queue()
    informer = LeaseInformer(kube, namespace, lambda kind, record: events.put((kind, record)))
    informer.start()
    try:
        assert informer.synced.wait(WAIT), f"the first list did not end within {WAIT:.0f}s"
        leases.delete_namespaced_lease("n2", namespace)
        seen = []
        deadline = time.monotonic() + WAIT
        while ("DELETED", "n2") not in seen and time.monotonic() < deadline:
            try:
                kind, record = events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            seen.append((kind, record.name))
    finally:
        informer.stop(timeout=WAIT)
    assert seen == [("SYNC", "n1"), ("SYNC", "n2"), ("DELETED", "n2")], (
        f"a lease lost or deleted before its time: {seen}"
    )
