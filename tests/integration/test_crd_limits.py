"""Bad input fails closed and cheaply: the API server itself refuses an oversized
string, list or map in any sandlot kind, naming the field, and accepts every
quantity ``policy.quantity`` parses. Claimed against the real kube-apiserver."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api import GROUP, VERSION
from sandlot.api.common import (
    MAX_ARG,
    MAX_ARGS,
    MAX_CAPABILITIES,
    MAX_ENTRIES,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_IMAGE,
    MAX_NAME,
    MAX_NODES,
    MAX_PORTS,
)
from sandlot.api.pool import MAX_POOL_REPLICAS
from sandlot.policy.quantity import memory_bytes

pytestmark = pytest.mark.integration


def _sandbox(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "example.test/busybox:1", **spec},
    }


def _refusal(call: Any) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 422, err.value.body
    return str(json.loads(err.value.body or "")["message"])


OVERSIZED_SANDBOX = [
    ({"image": "x" * (MAX_IMAGE + 1)}, "spec.image"),
    ({"command": ["y" * (MAX_ARG + 1)]}, "spec.command[0]"),
    ({"command": ["true"] * (MAX_ARGS + 1)}, "spec.command"),
    ({"env": [{"name": f"V{i}", "value": ""} for i in range(MAX_ENV + 1)]}, "spec.env"),
    ({"env": [{"name": "BIG", "value": "v" * (MAX_ENV_VALUE + 1)}]}, "spec.env[0].value"),
    ({"env": [{"name": "N" * 1025}]}, "spec.env[0].name"),
    (
        {"ports": [{"containerPort": 1 + i} for i in range(MAX_PORTS + 1)]},
        "spec.ports",
    ),
    ({"nodeName": "n" * (MAX_NAME + 1)}, "spec.nodeName"),
    (
        {"securityContext": {"capabilities": {"add": ["KILL"] * (MAX_CAPABILITIES + 1)}}},
        "spec.securityContext.capabilities.add",
    ),
    (
        {"securityContext": {"capabilities": {"add": ["C" * 65]}}},
        "spec.securityContext.capabilities.add[0]",
    ),
    ({"resources": {"limits": {"memory": "9" * 65}}}, "spec.resources.limits.memory"),
]


@pytest.mark.parametrize(
    ("spec", "field"),
    OVERSIZED_SANDBOX,
    ids=[
        "image",
        "command argument",
        "command length",
        "env count",
        "env value",
        "env name",
        "ports",
        "nodeName",
        "capabilities count",
        "capability name",
        "memory quantity",
    ],
)
def test_oversized_sandbox_field_is_refused_naming_it(
    kube: client.ApiClient, namespace: str, spec: dict[str, Any], field: str
) -> None:
    api: Any = client.CustomObjectsApi(kube)
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", _sandbox("big", **spec), dry_run="All"
        )
    )
    assert f"{field}:" in message and ("Too long" in message or "Too many" in message), message


def test_oversized_status_message_is_refused(kube: client.ApiClient, namespace: str) -> None:
    api: Any = client.CustomObjectsApi(kube)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", _sandbox("st"))
    message = _refusal(
        lambda: api.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            "st",
            {"status": {"phase": "Failed", "message": "m" * 40000}},
        )
    )
    assert "status.message:" in message and "Too long" in message, message


def test_oversized_pool_template_labels_are_refused(kube: client.ApiClient, namespace: str) -> None:
    api: Any = client.CustomObjectsApi(kube)
    labels = {f"k{i}": "v" for i in range(MAX_ENTRIES + 1)}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": "big"},
        "spec": {
            "template": {"metadata": {"labels": labels}, "spec": {"image": "example.test/b:1"}}
        },
    }
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxpools", body, dry_run="All"
        )
    )
    assert "spec.template.metadata.labels:" in message and "Too many" in message, message


def test_a_pool_asking_more_than_any_operator_keeps_is_refused(
    kube: client.ApiClient, namespace: str
) -> None:
    api: Any = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": "huge"},
        "spec": {"replicas": MAX_POOL_REPLICAS + 1, "template": {"spec": {"image": "e.test/b:1"}}},
    }
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxpools", body, dry_run="All"
        )
    )
    assert "spec.replicas" in message and str(MAX_POOL_REPLICAS) in message, message


def test_oversized_cache_prune_node_list_is_refused(kube: client.ApiClient) -> None:
    api: Any = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CachePrune",
        "metadata": {"name": "big"},
        "spec": {"nodes": [f"n{i}" for i in range(MAX_NODES + 1)]},
    }
    message = _refusal(
        lambda: api.create_cluster_custom_object(GROUP, VERSION, "cacheprunes", body, dry_run="All")
    )
    assert "spec.nodes:" in message and "Too many" in message, message


@pytest.mark.parametrize(
    "memory", ["4Mi", "4096Ki", "1.5Gi", "1Pi", "100M", "1e9", ".5Gi", "64Mi"], ids=str
)
def test_every_quantity_the_agent_parses_is_accepted(
    kube: client.ApiClient, namespace: str, memory: str
) -> None:
    assert memory_bytes(memory) > 0
    api: Any = client.CustomObjectsApi(kube)
    body = _sandbox("q", resources={"limits": {"memory": memory, "cpu": memory}})
    created = api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", body, dry_run="All"
    )
    assert created["spec"]["resources"]["limits"]["memory"] == memory


@pytest.mark.parametrize("memory", ["lots", "-1Gi", "1GB", "1.5.Gi"], ids=str)
def test_a_memory_limit_that_is_not_a_quantity_is_refused(
    kube: client.ApiClient, namespace: str, memory: str
) -> None:
    api: Any = client.CustomObjectsApi(kube)
    body = _sandbox("q", resources={"limits": {"memory": memory}})
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", body, dry_run="All"
        )
    )
    assert "spec.resources.limits.memory" in message, message


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"memory": "0"}, "spec.resources.limits.memory"),
        ({"memory": "0Mi"}, "spec.resources.limits.memory"),
        ({"memory": "1"}, "spec.resources.limits.memory"),
        ({"memory": "4095Ki"}, "spec.resources.limits.memory"),
        ({"cpu": "0"}, "spec.resources.limits.cpu"),
        ({"ephemeralStorage": "0"}, "spec.resources.limits.ephemeralStorage"),
        ({"ephemeralStorage": "1023Ki"}, "spec.resources.limits.ephemeralStorage"),
    ],
    ids=[
        "memory 0",
        "memory 0Mi",
        "memory 1 byte",
        "memory just under 4Mi",
        "cpu 0",
        "disk 0",
        "disk just under 1Mi",
    ],
)
def test_a_limit_that_would_mean_none_is_refused_naming_the_field(
    kube: client.ApiClient, namespace: str, limits: dict[str, str], field: str
) -> None:
    # runc reads a memory limit of 0 as none: the API server must never store one.
    api: Any = client.CustomObjectsApi(kube)
    body = _sandbox("tiny", resources={"limits": limits})
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", body, dry_run="All"
        )
    )
    assert f"{field}:" in message and "must be at least" in message, message


def test_a_pool_template_with_a_zero_memory_limit_is_refused(
    kube: client.ApiClient, namespace: str
) -> None:
    api: Any = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": "tiny"},
        "spec": {
            "template": {
                "spec": {"image": "example.test/b:1", "resources": {"limits": {"memory": "0"}}}
            }
        },
    }
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxpools", body, dry_run="All"
        )
    )
    assert "spec.template.spec.resources.limits.memory:" in message, message


@pytest.mark.parametrize(
    ("probe", "says"),
    [
        ({}, "exactly one of exec, httpGet, tcpSocket"),
        (
            {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}},
            "exactly one of exec, httpGet, tcpSocket",
        ),
        ({"tcpSocket": {"port": 0}}, "spec.readinessProbe.tcpSocket.port"),
        ({"tcpSocket": {"port": 80}, "timeoutSeconds": 61}, "spec.readinessProbe.timeoutSeconds"),
        ({"tcpSocket": {"port": 80}, "periodSeconds": 0}, "spec.readinessProbe.periodSeconds"),
    ],
    ids=["no handler", "two handlers", "port 0", "timeout past its bound", "period 0"],
)
def test_a_readiness_probe_outside_its_shape_is_refused(
    kube: client.ApiClient, namespace: str, probe: dict[str, Any], says: str
) -> None:
    api: Any = client.CustomObjectsApi(kube)
    body = _sandbox("probed", readinessProbe=probe)
    message = _refusal(
        lambda: api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", body, dry_run="All"
        )
    )
    assert says in message, message


def test_a_readiness_probe_gets_the_pods_defaults(kube: client.ApiClient, namespace: str) -> None:
    api: Any = client.CustomObjectsApi(kube)
    body = _sandbox("probed", readinessProbe={"httpGet": {"port": 8080}})
    created = api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", body, dry_run="All"
    )
    assert created["spec"]["readinessProbe"] == {
        "httpGet": {"path": "/", "port": 8080},
        "initialDelaySeconds": 0,
        "periodSeconds": 10,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
