"""The local control plane runs kube-controller-manager's garbage collector and
namespace controller: deleting a SandboxPool deletes its Sandboxes (their
ownerReference), and deleting a namespace deletes its sandlot objects, as on a
cluster."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def make_pool_with_members(objs: Any, namespace: str, pool: str, count: int) -> list[str]:
    body = objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxpools",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxPool",
            "metadata": {"name": pool},
            "spec": {"replicas": 0, "template": {"spec": {"image": "example.test/app:1"}}},
        },
    )
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "name": pool,
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    names = [f"{pool}-{i}" for i in range(count)]
    for name in names:
        objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": name, "ownerReferences": [owner]},
                "spec": {"image": "example.test/app:1"},
            },
        )
    return names


def sandboxes_in(objs: Any, namespace: str) -> set[str]:
    items = objs.list_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes")["items"]
    return {i["metadata"]["name"] for i in items}


def test_control_plane_runs_the_garbage_collector(control_plane: ControlPlane) -> None:
    assert "kube-controller-manager" in control_plane.pids()


def test_deleting_a_pool_deletes_its_sandboxes(kube: client.ApiClient, namespace: str) -> None:
    objs: Any = client.CustomObjectsApi(kube)
    members = make_pool_with_members(objs, namespace, "gone", 3)
    make_pool_with_members(objs, namespace, "stays", 1)
    objs.delete_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxpools", "gone")
    wait_for(
        lambda: not (sandboxes_in(objs, namespace) & set(members)),
        timeout=60,
        what="the garbage collector to delete the pool's sandboxes",
    )
    assert sandboxes_in(objs, namespace) == {"stays-0"}, "another pool's member stays"


def test_deleting_a_namespace_deletes_its_sandboxes(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    objs: Any = client.CustomObjectsApi(kube)
    name = f"gc-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    make_pool_with_members(objs, name, "p", 2)
    core.delete_namespace(name)

    def namespace_gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(namespace_gone, timeout=90, what=f"namespace {name} to be emptied and deleted")
    left = objs.list_cluster_custom_object(GROUP, VERSION, "sandboxes")["items"]
    assert not [i for i in left if i["metadata"]["namespace"] == name]
