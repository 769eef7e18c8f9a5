"""A node cannot draw other tenants' sandboxes by clearing the taints it mirrors, on
the real API server.

The chart's identities, RBAC and write policies (``installed``), an operator as the
chart runs it, the placement policy (``sandlot.api.placementpolicy``, its binding
narrowed to this test's nodes by one more label) and a Kubernetes Node tainted for
another tenant. The node's own credentials (a token bound to a Pod on that node)
clear its SandboxNode's ``status.nodeTaints``: a Sandbox placed there by hand that
does not tolerate the Node's taint is still refused, and the node can change
neither the copy the policy reads (``status.trustedNodeTaints``) nor the label
that selects it.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import TAINTED_LABEL
from sandlot.api.placementpolicy import RULE, placement_policy
from sandlot.devtools.controlplane import ControlPlane
from tests.support.chart import Installed, helm, installed, operator_replica, sa_kubeconfig
from tests.support.kube import Kubectl
from tests.support.operator import Fleet, OperatorProcess, wipe_nodes
from tests.support.wait import wait_for

__all__ = ["helm", "installed"]  # fixtures

pytestmark = pytest.mark.integration

RUN_LABEL = "sandlot.test/node-trust-run"
TENANT = {"key": "sandlot.test/tenant", "value": "b", "effect": "NoSchedule"}


@pytest.fixture
def run(kubectl: Kubectl) -> Iterator[str]:
    """The placement policy, its binding selecting only nodes labelled with this run."""
    tag = "r" + uuid.uuid4().hex[:6]
    docs = copy.deepcopy(placement_policy(f"pt{tag}"))
    docs[1]["spec"]["paramRef"]["selector"]["matchLabels"][RUN_LABEL] = tag
    kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    yield tag
    kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )


@pytest.fixture
def kube_node(kube: client.ApiClient) -> Iterator[Callable[[str, list[dict[str, str]]], None]]:
    core: Any = client.CoreV1Api(kube)
    made: list[str] = []

    def make(name: str, taints: list[dict[str, str]]) -> None:
        core.create_node({"metadata": {"name": name}, "spec": {"taints": taints}})
        made.append(name)

    yield make
    for name in made:
        core.delete_node(name)


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body)


def _placement_refusal(create: Callable[[], object]) -> str | None:
    """The placement policy's message if ``create()`` was refused by it; None if it passed."""
    try:
        create()
    except ApiException as e:
        if e.status in (403, 422) and RULE in _message(e):
            return _message(e)
        raise
    return None


def _refused(call: Callable[[], object], rule: str) -> str:
    with pytest.raises(ApiException) as info:
        call()
    message = _message(info.value)
    assert info.value.status == 403 and f"rule {rule}:" in message, message
    return message


def test_a_node_that_clears_its_mirrored_taints_still_gets_no_untolerating_sandbox(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    installed: Installed,
    namespace: str,
    run: str,
    kube_node: Callable[[str, list[dict[str, str]]], None],
    tmp_path: Path,
) -> None:
    wipe_nodes(kube)  # the operator judges the whole fleet
    fleet = Fleet(kube, namespace, installed.namespace)
    agent_api: client.ApiClient | None = None
    op: OperatorProcess | None = None
    try:
        hostile, sentinel = fleet.node("hostile"), fleet.node("sentinel")
        for node in (hostile, sentinel):
            fleet.objs.patch_cluster_custom_object(
                GROUP, VERSION, "sandboxnodes", node, {"metadata": {"labels": {RUN_LABEL: run}}}
            )
        kube_node(hostile, [TENANT])
        config = sa_kubeconfig(
            kube, control_plane, installed, "agent", tmp_path / "agent.kubeconfig", node=hostile
        )
        agent_api = load_api_client(str(config))
        agent: Any = client.CustomObjectsApi(agent_api)

        def agent_status(status: dict[str, Any], **extra: Any) -> Any:
            return agent.patch_cluster_custom_object_status(
                GROUP, VERSION, "sandboxnodes", hostile, {**extra, "status": status}
            )

        def write_policy_in_force() -> bool:
            try:
                agent.patch_cluster_custom_object_status(
                    GROUP, VERSION, "sandboxnodes", sentinel, {"status": {"address": "10.0.0.1"}}
                )
            except ApiException as e:
                return e.status == 403 and "agent-own-sandboxnode" in _message(e)
            return False

        wait_for(write_policy_in_force, timeout=30, interval=0.3, what="the agent write policy")
        agent_status({"nodeTaints": [TENANT]})  # what an honest agent mirrors at registration
        op_config, identity = operator_replica(kube, control_plane, installed, tmp_path)
        op = OperatorProcess(
            control_plane,
            tmp_path,
            installed.namespace,
            "--resync-interval",
            "1s",
            kubeconfig=op_config,
            identity=identity,
        )
        op.wait_metrics()
        probes = iter(range(10_000))

        def place(node: str) -> str | None:
            """A tenant's sandbox, no tolerations, onto ``node`` by hand."""
            return _placement_refusal(
                lambda: fleet.sandbox(f"by-hand-{next(probes)}", node, phase=None)
            )

        wait_for(
            lambda: place(hostile) is not None,
            timeout=30,
            interval=0.3,
            what="the policy to refuse a sandbox onto the tainted node",
        )

        # The node turns against the fleet: its own credentials clear its mirror.
        agent_status({"nodeTaints": []})
        # A later write the policy's parameters (one watch, in order) must have seen:
        # the operator labels the sentinel once an admin taints it.
        fleet.objs.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "sandboxnodes",
            sentinel,
            {"spec": {"taints": [{"key": "sandlot.test/sentinel", "effect": "NoExecute"}]}},
        )
        wait_for(
            lambda: place(sentinel) is not None,
            timeout=30,
            interval=0.3,
            what="the policy to see the sentinel's taint, written after the node's clearing",
        )
        refused = place(hostile)
        assert refused is not None, (
            "a sandbox placed by hand onto a node whose Kubernetes Node is tainted passed "
            "admission once the node cleared its own mirror"
        )
        assert hostile in refused and "sandlot.test/tenant=b:NoSchedule" in refused, refused

        got = fleet.get_node(hostile)
        assert got["metadata"]["labels"].get(TAINTED_LABEL) == "true", got["metadata"]
        assert got["status"]["trustedNodeTaints"] == [TENANT], got["status"]
        assert got["status"]["nodeTaints"] == [], got["status"]
        # Nor can it touch what the policy reads: the copy, the label.
        rule = "agent-node-status-not-operators"
        _refused(lambda: agent_status({"trustedNodeTaints": []}), rule)
        with pytest.raises(ApiException) as info:  # RBAC refuses it first (no patch)
            agent.patch_cluster_custom_object(
                GROUP,
                VERSION,
                "sandboxnodes",
                hostile,
                {"metadata": {"labels": {TAINTED_LABEL: None}}},
            )
        assert info.value.status == 403, _message(info.value)
        agent_status({"address": "10.9.9.9"}, metadata={"labels": {TAINTED_LABEL: None}})
        got = fleet.get_node(hostile)
        assert got["metadata"]["labels"].get(TAINTED_LABEL) == "true", got["metadata"]
        assert got["status"]["trustedNodeTaints"] == [TENANT], got["status"]
    finally:
        if op is not None:
            op.stop()
        if agent_api is not None:
            agent_api.close()
        fleet.cleanup()
