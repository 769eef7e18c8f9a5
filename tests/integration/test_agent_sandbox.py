"""agent-sandbox's objects served by a real operator over sandlot's own pools and
claims, on the real control plane with a real agent: a SandboxWarmPool becomes a
sandlot pool whose members run, a SandboxClaim is bound to one of them and says so
in agent-sandbox's words (status.sandbox.name, Ready), with an agents.x-k8s.io
Sandbox mirroring it; deleting the claim removes its sandbox. What sandlot cannot
honour is refused on the claim, with agent-sandbox's reason naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from tests.support.kube import agent_sandbox_crds
from tests.support.pools import IMAGE, OPERATOR_FLAGS, SLEEPER, Cluster, Start
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

EXT = ("extensions.agents.x-k8s.io", "v1beta1")
AGENTS = ("agents.x-k8s.io", "v1beta1")


def _container(**extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": IMAGE, "command": SLEEPER[:1], "args": SLEEPER[1:], **extra}


def _template(cluster: Cluster, name: str, containers: list[dict[str, Any]], **spec: Any) -> None:
    body = {
        "apiVersion": "/".join(EXT),
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": containers, "terminationGracePeriodSeconds": 1},
            },
            **spec,
        },
    }
    cluster.objs.create_namespaced_custom_object(*EXT, cluster.namespace, "sandboxtemplates", body)


def _warm_pool(cluster: Cluster, name: str, template: str, replicas: int) -> None:
    body = {
        "apiVersion": "/".join(EXT),
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }
    cluster.objs.create_namespaced_custom_object(*EXT, cluster.namespace, "sandboxwarmpools", body)


def _claim(cluster: Cluster, name: str, pool: str, **spec: Any) -> None:
    body = {
        "apiVersion": "/".join(EXT),
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}, **spec},
    }
    cluster.objs.create_namespaced_custom_object(*EXT, cluster.namespace, "sandboxclaims", body)


def _get(cluster: Cluster, gv: tuple[str, str], plural: str, name: str) -> dict[str, Any] | None:
    found = cluster.objs.list_namespaced_custom_object(
        *gv, cluster.namespace, plural, field_selector=f"metadata.name={name}"
    )["items"]
    return found[0] if found else None


def _ready(body: dict[str, Any] | None) -> dict[str, Any]:
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


@pytest.fixture
def compat(cluster: Cluster, operators: Start) -> Iterator[Cluster]:
    with agent_sandbox_crds(cluster.kube):
        # Not about networking: the node's loopback, whatever CNI configuration the host has.
        cluster.agent_overrides["network_mode"] = "host-address"
        cluster.add_node("a", capacity=10)
        op = operators(*OPERATOR_FLAGS, "--agent-sandbox")
        wait_for(op.is_leader, timeout=30, what="the operator to lead")
        yield cluster


def test_a_claim_on_a_warm_pool_is_bound_to_a_warm_sandlot_member_and_goes_with_it(
    compat: Cluster,
) -> None:
    cluster = compat
    _template(cluster, "python", [_container(resources={"limits": {"memory": "64Mi"}})])
    _warm_pool(cluster, "python-pool", "python", 2)
    warm = {m["metadata"]["name"] for m in cluster.wait_running("python-pool", 2)}
    member = cluster.members("python-pool")[0]
    assert member["spec"]["command"] == SLEEPER
    assert member["spec"]["resources"]["limits"]["memory"] == "64Mi"
    wait_for(
        lambda: (
            (_get(cluster, EXT, "sandboxwarmpools", "python-pool") or {})
            .get("status", {})
            .get("readyReplicas")
            == 2
        ),
        timeout=20,
        what="the warm pool to count 2 ready",
    )

    _claim(cluster, "sandbox-claim-0a1b2c3d", "python-pool")
    claim = wait_for(
        lambda: (
            (c := _get(cluster, EXT, "sandboxclaims", "sandbox-claim-0a1b2c3d"))
            and _ready(c).get("status") == "True"
            and c
        ),
        timeout=20,
        what="the claim to be Ready",
    )
    name = claim["status"]["sandbox"]["name"]
    assert name in warm, "bound to a member that was already running"
    assert _ready(claim)["lastTransitionTime"]
    sandbox = cluster.objs.get_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "sandboxes", name
    )
    mirror = _get(cluster, AGENTS, "sandboxes", name)
    assert mirror is not None and _ready(mirror).get("status") == "True"
    assert mirror["status"]["podIPs"] == [sandbox["status"]["ip"]]
    assert claim["status"]["sandbox"]["podIPs"] == [sandbox["status"]["ip"]]
    cluster.wait_running("python-pool", 2)  # the pool replaced the member it lost

    cluster.objs.delete_namespaced_custom_object(
        *EXT, cluster.namespace, "sandboxclaims", "sandbox-claim-0a1b2c3d"
    )
    wait_for(
        lambda: (
            _get(cluster, (GROUP, VERSION), "sandboxes", name) is None
            and _get(cluster, AGENTS, "sandboxes", name) is None
            and _get(cluster, (GROUP, VERSION), "sandboxclaims", "sandbox-claim-0a1b2c3d") is None
        ),
        timeout=30,
        what=f"sandbox {name}, its mirror and its sandlot claim to go with the claim",
    )

    objs: Any = client.CustomObjectsApi(cluster.kube)
    scale = objs.patch_namespaced_custom_object_scale(
        *EXT, cluster.namespace, "sandboxwarmpools", "python-pool", {"spec": {"replicas": 3}}
    )
    assert scale["spec"]["replicas"] == 3
    cluster.wait_running("python-pool", 3)


@pytest.mark.parametrize(
    ("setup", "reason", "names"),
    [
        ("no-pool", "WarmPoolNotFound", "missing"),
        ("no-template", "TemplateNotFound", "absent"),
        ("two-containers", "InvalidConfiguration", "spec.podTemplate.spec.containers"),
        ("volumes", "VolumeClaimTemplatesError", "spec.volumeClaimTemplates"),
        ("env", "EnvVarsInjectionRejected", "spec.env"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." not in v else "",
)
def test_what_sandlot_cannot_serve_is_refused_on_the_claim_naming_why(
    compat: Cluster, setup: str, reason: str, names: str
) -> None:
    cluster = compat
    pool = "missing" if setup == "no-pool" else "p"
    if setup == "no-template":
        _warm_pool(cluster, "p", "absent", 1)
    elif setup == "two-containers":
        _template(cluster, "t", [_container(), _container(name="side")])
        _warm_pool(cluster, "p", "t", 1)
    elif setup in ("volumes", "env"):
        _template(cluster, "t", [_container()])
        _warm_pool(cluster, "p", "t", 1)
    extra: dict[str, Any] = {}
    if setup == "volumes":
        extra["volumeClaimTemplates"] = [{"metadata": {"name": "data"}}]
    if setup == "env":
        extra["env"] = [{"name": "X", "value": "1"}]
    _claim(cluster, "refused", pool, **extra)
    ready = wait_for(
        lambda: _ready(_get(cluster, EXT, "sandboxclaims", "refused")) or None,
        timeout=20,
        what="the claim's Ready condition",
    )
    assert (ready["status"], ready["reason"]) == ("False", reason), ready
    assert names in ready["message"], ready
    assert _get(cluster, (GROUP, VERSION), "sandboxclaims", "refused") is None
