"""agent-sandbox's objects in sandlot's terms (``sandlot.policy.agentsandbox``): a
template's one container becomes a sandlot spec, what sandlot cannot honour is a
refusal in agent-sandbox's words naming the field, and a claim's Ready follows its
sandlot claim and sandbox."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.reasons import AgentSandboxReason as Reason
from sandlot.policy.agentsandbox import (
    Refusal,
    SandboxView,
    Translated,
    check_claim,
    claim_env,
    claim_view,
    ends_by_deletion,
    sandlot_claim_spec,
    spec_hash,
    translate_template,
    warm_pool_spec,
    warm_pool_status,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def template(container: dict[str, Any] | None = None, **pod: Any) -> dict[str, Any]:
    c = {"name": "main", "image": "python:3.12", **(container or {})}
    return {
        "podTemplate": {"metadata": {"labels": {"app": "py"}}, "spec": {"containers": [c], **pod}}
    }


def test_one_container_becomes_a_sandlot_spec_command_and_args_joined() -> None:
    out = translate_template(
        template(
            {
                "command": ["python", "-c"],
                "args": ["print(1)"],
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"name": "http", "containerPort": 8888, "protocol": "TCP"}],
                "resources": {
                    "limits": {"cpu": "500m", "memory": "256Mi"},
                    "requests": {"cpu": "1"},
                },
                "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": False},
            },
            runtimeClassName="gvisor",
            securityContext={"runAsNonRoot": True},
            restartPolicy="Always",
        )
    )
    assert isinstance(out, Translated), out
    assert out.spec["image"] == "python:3.12"
    assert out.spec["command"] == ["python", "-c", "print(1)"]
    assert out.spec["env"] == [{"name": "A", "value": "1"}]
    assert out.spec["ports"] == [{"name": "http", "containerPort": 8888, "protocol": "TCP"}]
    assert out.spec["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    assert out.spec["runtimeClassName"] == "gvisor"
    assert out.spec["securityContext"] == {"runAsUser": 1000, "runAsNonRoot": True}
    assert out.labels == {"app": "py"}
    assert out.env_names == frozenset({"A"}) and out.container_name == "main"


@pytest.mark.parametrize(
    ("spec", "reason", "field"),
    [
        (
            {"podTemplate": {"spec": {"containers": []}}},
            Reason.INVALID_CONFIGURATION,
            "spec.podTemplate.spec.containers",
        ),
        (
            {"podTemplate": {"spec": {"containers": [{"image": "a"}, {"image": "b"}]}}},
            Reason.INVALID_CONFIGURATION,
            "spec.podTemplate.spec.containers",
        ),
        (template(volumes=[{"name": "v"}]), Reason.VOLUME_CLAIM_TEMPLATES_ERROR, ".volumes"),
        (
            template({"volumeMounts": [{"name": "v", "mountPath": "/v"}]}),
            Reason.VOLUME_CLAIM_TEMPLATES_ERROR,
            "volumeMounts",
        ),
        (
            {**template(), "volumeClaimTemplates": [{"metadata": {"name": "d"}}]},
            Reason.VOLUME_CLAIM_TEMPLATES_ERROR,
            "spec.volumeClaimTemplates",
        ),
        (template(initContainers=[{"image": "x"}]), Reason.INVALID_CONFIGURATION, "initContainers"),
        (template({"workingDir": "/w"}), Reason.INVALID_CONFIGURATION, "containers[0].workingDir"),
        (template({"args": ["x"]}), Reason.INVALID_CONFIGURATION, "containers[0].args"),
        (
            template({"securityContext": {"capabilities": {"drop": ["ALL"]}}}),
            Reason.INVALID_CONFIGURATION,
            "capabilities.drop",
        ),
        (
            template({"securityContext": {"allowPrivilegeEscalation": True}}),
            Reason.INVALID_CONFIGURATION,
            "allowPrivilegeEscalation",
        ),
        (
            template({"ports": [{"containerPort": 80, "hostPort": 80}]}),
            Reason.INVALID_CONFIGURATION,
            "ports[0].hostPort",
        ),
        (
            {**template(), "networkPolicy": {"egress": []}},
            Reason.INVALID_CONFIGURATION,
            "spec.networkPolicy",
        ),
        (template({"image": ""}), Reason.INVALID_CONFIGURATION, "image"),
    ],
    ids=[
        "no-container",
        "two-containers",
        "pod-volumes",
        "volume-mounts",
        "volume-claim-templates",
        "init-containers",
        "working-dir",
        "args-without-command",
        "capabilities-drop",
        "privilege-escalation",
        "host-port",
        "network-policy",
        "empty-image",
    ],
)
def test_what_sandlot_cannot_honour_is_refused_naming_the_field(
    spec: dict[str, Any], reason: Reason, field: str
) -> None:
    out = translate_template(spec)
    assert isinstance(out, Refusal), out
    assert out.reason == reason and field in out.message, out


@pytest.mark.parametrize(
    ("claim", "policy", "template_env", "reason"),
    [
        ({}, None, [], None),
        ({"env": [{"name": "X", "value": "1"}]}, None, [], Reason.ENV_VARS_INJECTION_REJECTED),
        ({"env": [{"name": "X", "value": "1"}]}, "Allowed", [], None),
        (
            {"env": [{"name": "A", "value": "1"}]},
            "Allowed",
            [{"name": "A", "value": "0"}],
            Reason.ENV_VARS_INJECTION_REJECTED,
        ),
        ({"env": [{"name": "A", "value": "1"}]}, "Overrides", [{"name": "A", "value": "0"}], None),
        (
            {"env": [{"name": "A", "value": "1", "containerName": "other"}]},
            "Overrides",
            [],
            Reason.INVALID_CONFIGURATION,
        ),
        (
            {"volumeClaimTemplates": [{"metadata": {"name": "d"}}]},
            None,
            [],
            Reason.VOLUME_CLAIM_TEMPLATES_ERROR,
        ),
        (
            {"additionalPodMetadata": {"labels": {"sandlot.dev/pool": "x"}}},
            None,
            [],
            Reason.INVALID_METADATA,
        ),
        ({"additionalPodMetadata": {"labels": {"team": "a"}}}, None, [], None),
    ],
    ids=[
        "nothing",
        "env-disallowed-by-default",
        "env-allowed-new",
        "env-allowed-no-override",
        "env-overrides",
        "env-other-container",
        "claim-volumes",
        "reserved-label",
        "plain-label",
    ],
)
def test_a_claim_is_checked_against_its_templates_policies(
    claim: dict[str, Any], policy: str | None, template_env: list[Any], reason: Reason | None
) -> None:
    spec = template({"env": template_env})
    if policy:
        spec["envVarsInjectionPolicy"] = policy
    out = check_claim(claim, spec)
    assert (out.reason if out else None) == reason, out


def test_claim_env_is_what_commands_through_the_claim_get() -> None:
    assert claim_env({"env": [{"name": "A", "value": "1"}, {"name": "B"}]}) == {"A": "1", "B": ""}


@pytest.mark.parametrize(
    ("lifecycle", "wanted"),
    [
        (None, None),
        (
            {"shutdownTime": "2026-01-01T00:01:00Z", "shutdownPolicy": "Delete"},
            {"shutdownTime": "2026-01-01T00:01:00Z", "shutdownPolicy": "Delete"},
        ),
        (
            {"shutdownTime": "2026-01-01T00:01:00Z", "shutdownPolicy": "DeleteForeground"},
            {"shutdownTime": "2026-01-01T00:01:00Z", "shutdownPolicy": "Delete"},
        ),
        (
            {"shutdownTime": "2026-01-01T00:01:00Z", "ttlSecondsAfterFinished": 5},
            {
                "shutdownTime": "2026-01-01T00:01:00Z",
                "shutdownPolicy": "Retain",
                "ttlSecondsAfterFinished": 5,
            },
        ),
    ],
    ids=["none", "delete", "delete-foreground", "retain-by-default"],
)
def test_the_sandlot_claim_takes_the_pool_and_the_lifecycle(
    lifecycle: dict[str, Any] | None, wanted: dict[str, Any] | None
) -> None:
    spec: dict[str, Any] = {"warmPoolRef": {"name": "p"}}
    if lifecycle:
        spec["lifecycle"] = lifecycle
    out = sandlot_claim_spec(spec)
    assert out["poolName"] == "p" and out.get("lifecycle") == wanted


def test_only_a_delete_lifecycle_past_its_time_ends_by_deletion() -> None:
    due = (NOW - timedelta(seconds=1)).isoformat()
    later = (NOW + timedelta(seconds=1)).isoformat()
    assert ends_by_deletion({"lifecycle": {"shutdownTime": due, "shutdownPolicy": "Delete"}}, NOW)
    assert not ends_by_deletion(
        {"lifecycle": {"shutdownTime": later, "shutdownPolicy": "Delete"}}, NOW
    )
    assert not ends_by_deletion({"lifecycle": {"shutdownTime": due}}, NOW)
    assert not ends_by_deletion({}, NOW)


RUNNING = SandboxView("sb-1", "Running", ready=True, paused=False, ip="10.0.0.5")


@pytest.mark.parametrize(
    ("status", "sandbox", "ready", "reason"),
    [
        (None, None, False, Reason.WAITING_FOR_SANDBOX),
        (
            {"phase": "Pending", "message": "no Ready member"},
            None,
            False,
            Reason.WAITING_FOR_SANDBOX,
        ),
        ({"phase": "Bound", "sandboxName": "sb-1"}, RUNNING, True, Reason.SANDBOX_READY),
        (
            {"phase": "Bound", "sandboxName": "sb-1"},
            SandboxView("sb-1", "Running", ready=True, paused=True, ip="10.0.0.5"),
            False,
            Reason.SANDBOX_NOT_READY,
        ),
        ({"phase": "Lost", "sandboxName": "sb-1"}, None, False, Reason.POD_FAILED),
        ({"phase": "Expired", "sandboxName": "sb-1"}, None, False, Reason.CLAIM_EXPIRED),
    ],
    ids=["not-made", "pending", "bound-ready", "bound-paused", "lost", "expired"],
)
def test_a_claims_ready_follows_its_sandlot_claim_and_sandbox(
    status: dict[str, Any] | None, sandbox: SandboxView | None, ready: bool, reason: Reason
) -> None:
    view = claim_view(status, sandbox)
    assert (view.ready, view.reason) == (ready, reason)
    if ready:
        assert view.sandbox == "sb-1" and view.pod_ips == ("10.0.0.5",)


def test_warm_pool_counts_and_selector_come_from_its_sandlot_pool() -> None:
    status = {"running": 2, "pending": 1, "readyReplicas": 2, "selector": "sandlot.dev/pool=p"}
    assert warm_pool_status(status) == {
        "replicas": 3,
        "readyReplicas": 2,
        "selector": "sandlot.dev/pool=p",
    }
    assert warm_pool_status(None) == {"replicas": 0, "readyReplicas": 0, "selector": ""}


def test_a_changed_template_or_replicas_changes_the_digest_the_pool_is_rewritten_on() -> None:
    translated = translate_template(template())
    assert isinstance(translated, Translated)
    other = translate_template(template({"image": "python:3.13"}))
    assert isinstance(other, Translated)
    base = spec_hash(warm_pool_spec(translated, 2))
    assert base == spec_hash(warm_pool_spec(translated, 2))
    assert base != spec_hash(warm_pool_spec(translated, 3))
    assert base != spec_hash(warm_pool_spec(other, 2))
