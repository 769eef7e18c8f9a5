"""Images sandlot commits (snapshots, suspended sandboxes) are no tenant's to name:
the decisions (sandlot.policy.committed), the agent's backstop for a Sandbox stored
before the CRD refused the name (sandlot.agent.rules), and the schema rules the CRD
carries (claimed against the real API server in tests/integration/test_api_semantics.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandlot.agent.rules import NamespaceRules, StartFailed
from sandlot.agent.settings import AgentSettings
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import COMMITTED_IMAGE_REPOSITORIES, SandboxSpec
from sandlot.api.snapshot import SandboxSnapshotSpec
from sandlot.policy.committed import (
    COMMITTED_PREFIXES,
    owner_namespace,
    spec_image_refusal,
    start_refusal,
)
from sandlot.policy.snapshots import SNAPSHOT_IMAGE_LABEL, snapshot_image_name
from sandlot.policy.suspension import SUSPENDED_IMAGE_LABEL, suspended_image_name
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects


def test_the_crd_refuses_the_names_the_agent_commits_into() -> None:
    assert set(COMMITTED_IMAGE_REPOSITORIES) == set(COMMITTED_PREFIXES)
    assert snapshot_image_name("u").startswith(COMMITTED_PREFIXES)
    assert suspended_image_name("u").startswith(COMMITTED_PREFIXES)
    rule = SandboxSpec.model_json_schema()["properties"]["image"]["x-kubernetes-validations"][0]
    for prefix in COMMITTED_IMAGE_REPOSITORIES:
        assert f"startsWith('{prefix}')" in rule["rule"]


@pytest.mark.parametrize(
    ("image", "refused"),
    [
        ("sandlot.local/snapshots/0b1c-uid:latest", True),
        ("sandlot.local/suspended/0b1c-uid:latest", True),
        ("sandlot.local/snapshots/0b1c-uid", True),
        ("sandlot.local/snapshots/0b1c-uid@sha256:" + "a" * 64, True),
        ("SANDLOT.LOCAL/snapshots/0b1c-uid:latest", True),
        ("sandlot.local/sandlot:dev", False),
        ("docker.io/library/busybox:1.36", False),
        ("registry.example/sandlot.local/snapshots/x:1", False),
    ],
    ids=[
        "snapshot",
        "suspended",
        "untagged",
        "by-digest",
        "host-in-capitals",
        "another-local-image",
        "public-image",
        "same-words-elsewhere",
    ],
)
def test_spec_image_may_not_name_a_committed_image(image: str, refused: bool) -> None:
    refusal = spec_image_refusal(image)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert refusal.startswith("spec.image:") and "spec.snapshotRef" in refusal


@pytest.mark.parametrize(
    ("labels", "namespace", "refused"),
    [
        ({SNAPSHOT_IMAGE_LABEL: "team-a.prepared"}, "team-a", False),
        ({SNAPSHOT_IMAGE_LABEL: "team-a.prepared"}, "team-b", True),
        ({SUSPENDED_IMAGE_LABEL: "team-a.sb.with.dots"}, "team-a", False),
        ({SUSPENDED_IMAGE_LABEL: "team-a.sb"}, "team-ab", True),
        ({}, "team-b", False),
        (None, "team-b", False),
    ],
    ids=[
        "own-snapshot",
        "another-namespaces-snapshot",
        "own-suspended-name-with-dots",
        "another-namespace-sharing-a-prefix",
        "pulled-state-without-labels",
        "not-on-the-node",
    ],
)
def test_a_committed_image_starts_only_for_its_own_namespace(
    labels: dict[str, str] | None, namespace: str, refused: bool
) -> None:
    refusal = start_refusal("sandlot.local/snapshots/u:latest", labels, namespace)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert namespace in refusal and str(owner_namespace(labels)) in refusal


def _sandbox(image: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-b", "name": "thief", "uid": "u-2"},
        "spec": {"image": image, "securityContext": {"runAsNonRoot": True, "runAsUser": 1000}},
    }


def test_the_agent_refuses_a_stored_sandbox_naming_a_committed_image() -> None:
    objects = FakeObjects(FakeClock().now)
    rules = NamespaceRules(
        AgentSettings(node_name="n"),
        objects,  # type: ignore[arg-type]
        read=lambda _ns: ({}, {}),
    )
    with pytest.raises(StartFailed) as caught:
        rules.for_start(_sandbox(snapshot_image_name("uid-of-team-a")))
    assert caught.value.reason == SandboxReason.INVALID_IMAGE_NAME
    assert "spec.image" in str(caught.value)
    assert rules.for_start(_sandbox("docker.io/library/busybox:1.36")) is not None


@pytest.mark.parametrize(
    "name",
    ["../node", "Node-A", "node_a", "node a", "-node", "a" * 254, ""],
    ids=["path", "capitals", "underscore", "space", "leading-dash", "too-long", "empty"],
)
def test_a_node_name_is_a_dns_subdomain(name: str) -> None:
    with pytest.raises(ValidationError, match=r"node_name|nodeName"):
        SandboxSpec.model_validate({"image": "x", "nodeName": name})
    with pytest.raises(ValidationError, match=r"node_name|nodeName"):
        SandboxSnapshotSpec.model_validate({"sandboxName": "s", "nodeName": name})
    assert SandboxSpec.model_validate({"image": "x", "nodeName": "node-a.zone1"}).node_name
