"""docs/examples/sandbox-secrets-policy.yaml, applied as it is to the real API server:
in a namespace that opts in, a Sandbox or SandboxPool naming a Secret not marked
for sandboxes (``sandbox-*``) is refused at admission, whoever asks; one naming
only marked Secrets is admitted. Without it, a user who may create Sandboxes
reads every Secret of the namespace through one (docs/isolation.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from tests.support.kube import Kubectl
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MANIFEST = Path(__file__).resolve().parents[2] / "docs" / "examples" / "sandbox-secrets-policy.yaml"
IMAGE = "docker.io/sandlot/busybox:test"


def _sandbox(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": IMAGE, **spec},
    }


def _pool(name: str, **template_spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "template": {"spec": {"image": IMAGE, **template_spec}}},
    }


def _refusal(kube: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    """'' when a dry-run create is admitted, else the API server's message."""
    plural = "sandboxes" if body["kind"] == "Sandbox" else "sandboxpools"
    try:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, body, dry_run="All"
        )
    except client.ApiException as e:
        return f"{e.status}: {e.body}"
    return ""


@pytest.fixture
def restricted(kube: client.ApiClient, namespace: str, kubectl: Kubectl) -> Iterator[str]:
    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"labels": {"sandlot.dev/sandbox-secrets": "restricted"}}}
    )
    kubectl("apply", "-f", str(MANIFEST))
    try:
        yield namespace
    finally:
        with contextlib.suppress(AssertionError):
            kubectl("delete", "-f", str(MANIFEST), "--ignore-not-found")


def test_a_sandbox_naming_an_unmarked_secret_is_refused(
    kube: client.ApiClient, restricted: str
) -> None:
    from_db = {"envFrom": [{"secretRef": {"name": "db"}}]}
    # The policy takes effect asynchronously: the first refusal says when.
    said = wait_for(
        lambda: _refusal(kube, restricted, _sandbox("reads-db", **from_db)) or None,
        timeout=30,
        interval=0.2,
        what="the example policy to refuse a Sandbox whose envFrom names Secret db",
    )
    assert said.startswith("403") and "not: db" in said, said
    key_of_token = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "sa-token", "key": "token"}}},
        ]
    }
    said = _refusal(kube, restricted, _sandbox("reads-token", **key_of_token))
    assert said.startswith("403") and "not: sa-token" in said, said
    said = _refusal(kube, restricted, _pool("pool-reads-db", **from_db))
    assert said.startswith("403") and "not: db" in said, said

    marked = {
        "envFrom": [
            {"secretRef": {"name": "sandbox-db"}},
            {"configMapRef": {"name": "settings"}},
        ],
        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "sandbox-key", "key": "k"}}}],
    }
    assert _refusal(kube, restricted, _sandbox("reads-marked", **marked)) == ""
    assert _refusal(kube, restricted, _pool("pool-reads-marked", **marked)) == ""
    assert _refusal(kube, restricted, _sandbox("reads-nothing")) == ""


def test_a_namespace_that_did_not_opt_in_is_not_restricted(
    kube: client.ApiClient, restricted: str, namespace: str
) -> None:
    wait_for(
        lambda: (
            _refusal(kube, restricted, _sandbox("probe", envFrom=[{"secretRef": {"name": "db"}}]))
            or None
        ),
        timeout=30,
        interval=0.2,
        what="the example policy to take effect",
    )
    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"labels": {"sandlot.dev/sandbox-secrets": None}}}
    )
    wait_for(
        lambda: (
            _refusal(kube, namespace, _sandbox("x", envFrom=[{"secretRef": {"name": "db"}}])) == ""
        ),
        timeout=30,
        interval=0.2,
        what="an unlabelled namespace to admit a Sandbox naming any Secret",
    )
