"""A hand-set ``spec.nodeName`` onto a tainted SandboxNode, on the real API server:
the placement policy (``sandlot.api.placementpolicy``) refuses it exactly when
``sandlot.policy.placement`` says the sandbox does not tolerate the node's taints.

Each case is decided twice, by the Python the scheduler and the agent run and by
the policy's CEL, and the two must agree. The binding here selects only this
module's nodes (one more label beside ``sandlot.dev/tainted``), so it never
touches another test's sandboxes; the chart's copy is drift-tested in
``tests/unit/test_placement_admission.py``.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api import GROUP, VERSION
from sandlot.api.keys import TAINTED_LABEL
from sandlot.api.placement import CONTROL_PLANE_TAINT, Taint, Toleration
from sandlot.api.placementpolicy import CHART_TEMPLATE, RULE, placement_policy
from sandlot.devtools.controlplane import helm_path
from sandlot.policy.placement import untolerated
from tests.support.chart import render
from tests.support.kube import Kubectl
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

RUN_LABEL = "sandlot.test/placement-run"

NODES: dict[str, dict[str, list[dict[str, str]]]] = {
    "plain": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
    "nokey": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]},
    "two": {
        "taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "maintenance", "effect": "NoExecute"},
        ]
    },
    "prefer": {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]},
    # The operator's copy of the Kubernetes Node's taints, which the policy reads ...
    "copied": {"trustedNodeTaints": [{"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}]},
    # ... and the agent's own mirror, which it does not (a node may clear it).
    "mirror-only": {"nodeTaints": [{"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}]},
    "spare": {"taints": []},
}

CASES: list[tuple[str, str, list[dict[str, str]]]] = [
    ("no-tolerations", "plain", []),
    ("equal-key-and-value", "plain", [{"key": "dedicated", "value": "gpu"}]),
    ("equal-other-value", "plain", [{"key": "dedicated", "value": "cpu"}]),
    ("equal-no-value", "plain", [{"key": "dedicated"}]),
    ("exists-key", "plain", [{"key": "dedicated", "operator": "Exists"}]),
    ("exists-other-key", "plain", [{"key": "other", "operator": "Exists"}]),
    ("exists-no-key", "plain", [{"operator": "Exists"}]),
    ("equal-no-key", "plain", [{"value": "gpu"}]),
    ("effect-matches", "plain", [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
    ("effect-differs", "plain", [{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]),
    ("valueless-taint-equal", "nokey", [{"key": "maintenance", "operator": "Equal"}]),
    ("valueless-taint-value", "nokey", [{"key": "maintenance", "value": "x"}]),
    ("one-of-two", "two", [{"key": "dedicated", "operator": "Exists"}]),
    (
        "both-of-two",
        "two",
        [{"key": "dedicated", "operator": "Exists"}, {"key": "maintenance", "operator": "Exists"}],
    ),
    ("exists-no-key-effect", "two", [{"operator": "Exists", "effect": "NoExecute"}]),
    ("prefer-no-schedule-only", "prefer", []),
    ("copied-untolerated", "copied", []),
    ("copied-tolerated", "copied", [{"key": CONTROL_PLANE_TAINT, "operator": "Exists"}]),
    ("mirror-is-not-read", "mirror-only", []),
]


class Fleet:
    def __init__(self, kube: client.ApiClient, namespace: str, run: str) -> None:
        self.objs: Any = client.CustomObjectsApi(kube)
        self.namespace, self.run = namespace, run

    def node(self, key: str) -> str:
        return f"pa-{self.run}-{key}"

    def sandbox(self, name: str, node: str | None, tolerations: list[dict[str, str]]) -> None:
        spec: dict[str, Any] = {"image": "example.test/busybox:1", "tolerations": tolerations}
        if node is not None:
            spec["nodeName"] = node
        self.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": name},
                "spec": spec,
            },
        )


def _refusal(create: Any) -> str | None:
    """The policy's message if ``create()`` was refused by it; None if it passed."""
    try:
        create()
    except ApiException as exc:
        if exc.status in (403, 422) and RULE in str(exc.body):
            return str(exc.body)
        raise
    return None


@pytest.fixture(scope="module")
def fleet(kube: client.ApiClient, kubectl: Kubectl) -> Iterator[Fleet]:
    run = "r" + uuid.uuid4().hex[:6]  # never all digits and an e: YAML would read a float
    namespace = f"pa-{run}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    f = Fleet(kube, namespace, run)
    for key, taints in NODES.items():
        name = f.node(key)
        f.objs.create_cluster_custom_object(
            GROUP,
            VERSION,
            "sandboxnodes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxNode",
                "metadata": {"name": name, "labels": {TAINTED_LABEL: "true", RUN_LABEL: run}},
                "spec": {"taints": taints.get("taints", [])},
            },
        )
        status = {k: v for k, v in taints.items() if k in ("nodeTaints", "trustedNodeTaints")}
        if status:
            f.objs.patch_cluster_custom_object_status(
                GROUP, VERSION, "sandboxnodes", name, {"status": status}
            )
    docs = copy.deepcopy(placement_policy(f"pa{run}"))
    docs[1]["spec"]["paramRef"]["selector"]["matchLabels"][RUN_LABEL] = run
    kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    probe = iter(range(10_000))

    def in_force() -> bool:
        return _refusal(lambda: f.sandbox(f"probe-{next(probe)}", f.node("plain"), [])) is not None

    wait_for(in_force, timeout=30, interval=0.3, what="the placement policy to take effect")
    yield f
    kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )
    for key in NODES:
        f.objs.delete_cluster_custom_object(GROUP, VERSION, "sandboxnodes", f.node(key))
    core.delete_namespace(namespace)


@pytest.mark.parametrize(("case", "node", "tolerations"), CASES, ids=[c[0] for c in CASES])
def test_policy_decides_as_the_placement_code_does(
    fleet: Fleet, case: str, node: str, tolerations: list[dict[str, str]]
) -> None:
    spec = NODES[node]
    read = spec.get("taints", []) + spec.get("trustedNodeTaints", [])
    taints = [Taint.model_validate(t) for t in read]
    python_allows = not untolerated(taints, [Toleration.model_validate(t) for t in tolerations])
    refused = _refusal(lambda: fleet.sandbox(case, fleet.node(node), tolerations))
    assert (refused is None) is python_allows, (
        f"placement.py {'allows' if python_allows else 'refuses'}, the policy "
        f"{'allows' if refused is None else 'refuses: ' + refused}"
    )
    if refused is not None:
        assert fleet.node(node) in refused and "tolerate" in refused, refused


def test_binding_a_pending_sandbox_by_hand_is_refused_and_other_updates_pass(
    fleet: Fleet,
) -> None:
    fleet.sandbox("later", None, [])
    tainted, other = fleet.node("plain"), fleet.node("prefer")
    bind = {"spec": {"nodeName": tainted}}
    refused = _refusal(
        lambda: fleet.objs.patch_namespaced_custom_object(
            GROUP, VERSION, fleet.namespace, "sandboxes", "later", bind
        )
    )
    assert refused is not None and "dedicated=gpu:NoSchedule" in refused, refused
    # A node the sandbox may use; its later updates leave spec.nodeName alone.
    fleet.objs.patch_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxes", "later", {"spec": {"nodeName": other}}
    )
    fleet.objs.patch_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "sandboxes", "later", {"metadata": {"labels": {"a": "b"}}}
    )


def test_an_update_that_keeps_the_node_passes_after_the_node_was_tainted(
    fleet: Fleet, kube: client.ApiClient
) -> None:
    name = fleet.node("spare")
    fleet.sandbox("placed", name, [])
    fleet.objs.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "sandboxnodes",
        name,
        {"spec": {"taints": [{"key": "spot", "effect": "NoExecute"}]}},
    )
    try:
        # The policy sees the new taint (its params come from a watch cache) ...
        wait_for(
            lambda: (
                _refusal(lambda: fleet.sandbox(f"new-{uuid.uuid4().hex[:4]}", name, [])) is not None
            ),
            timeout=30,
            interval=0.3,
            what="the policy to see the node's new taint",
        )
        # ... and lets the sandbox already there be updated (and finalized) as before.
        fleet.objs.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            fleet.namespace,
            "sandboxes",
            "placed",
            {"metadata": {"labels": {"x": "y"}}},
        )
    finally:
        fleet.objs.patch_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", name, {"spec": {"taints": []}}
        )


def test_chart_renders_the_policy_these_tests_install_and_only_when_enabled() -> None:
    template = CHART_TEMPLATE.removeprefix("charts/sandlot/")
    rendered = render(helm_path(), "--show-only", template, release="sl")
    assert rendered == placement_policy("sl-sandlot")
    off = render(helm_path(), "--set", "placementPolicy.enabled=false", release="sl")
    assert not [d for d in off if d["metadata"]["name"] == "sl-sandlot-placement"]
