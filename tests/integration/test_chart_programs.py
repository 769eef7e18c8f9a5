"""The real programs run with the chart's credentials only, through the node-health
and agent scenarios. A verb the chart forgot shows up as a 403 in their logs or as
a scenario that never finishes; both fail here."""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.kube import load_api_client
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import POOL_LABEL
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from tests.support.chart import (
    Installed,
    helm,
    installed,
    operator_replica,
    sa_kubeconfig,
)
from tests.support.containerd import PrivateContainerd
from tests.support.operator import Fleet, OperatorProcess, wipe_nodes
from tests.support.wait import wait_for

__all__ = ["helm", "installed"]  # fixtures

pytestmark = pytest.mark.integration


# 403 as a status, never the milliseconds of a log line's timestamp (",403").
FORBIDDEN = re.compile(r"forbidden|(?<![,.:])\b403\b|not enough permissions", re.IGNORECASE)


def test_operator_reaps_a_lost_node_with_its_service_account_only(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    wipe_nodes(kube)
    fleet = Fleet(kube, namespace, installed.namespace)
    config, identity = operator_replica(kube, control_plane, installed, tmp_path)
    op = OperatorProcess(
        control_plane,
        tmp_path,
        installed.namespace,
        "--grace-period",
        "3s",
        "--resync-interval",
        "1s",
        kubeconfig=config,
        identity=identity,
    )
    try:
        op.wait_metrics()
        n1 = fleet.node("n1")
        lease = fleet.lease(n1)
        fleet.sandbox("run", n1, "Running")
        wait_for(lambda: op.is_leader(), timeout=20, what="the operator to lead via its Lease")
        wait_for(
            lambda: fleet.get_node(n1).get("status", {}).get("phase") == "Ready",
            timeout=20,
            what="node Ready while its lease is renewed",
        )
        lease.pause()
        wait_for(lambda: fleet.phase("run") == "Dead", timeout=30, what="sandbox Dead after grace")
        assert fleet.get("run")["status"]["reason"] == "NodeLost"
        # The node's deletion runs kopf's finalizer path with the same credentials.
        client.CustomObjectsApi(kube).delete_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", n1
        )
        wait_for(
            lambda: n1 not in {n["metadata"]["name"] for n in _nodes(kube)},
            timeout=20,
            what=f"SandboxNode {n1} deleted through the operator's finalizer",
        )
    finally:
        op.stop()
        fleet.cleanup()
    denied = [line for line in op.log_path.read_text().splitlines() if FORBIDDEN.search(line)]
    assert not denied, "the operator was refused:\n" + "\n".join(denied[:20])


def _nodes(kube: client.ApiClient) -> list[dict[str, Any]]:
    objs: Any = client.CustomObjectsApi(kube)
    return list(objs.list_cluster_custom_object(GROUP, VERSION, "sandboxnodes")["items"])


AGENT_IMAGE = "docker.io/sandlot/chart-busybox:test"


@pytest.fixture
def agent_ctr_ns(
    containerd: PrivateContainerd, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    from sandlot.adapters.containerd import ContainerdRuntime
    from sandlot.agent.teardown import teardown_many

    archive = tmp_path_factory.mktemp("chart-images") / "busybox.tar"
    build_image_archive(archive, AGENT_IMAGE)
    ns = f"chart-{uuid.uuid4().hex[:8]}"
    import_archive(containerd.address, ns, archive, timeout=60)
    yield ns
    rt = ContainerdRuntime(containerd.address, ns)
    try:
        ids = [c.id for c in rt.list_containers(timeout=10)]
        teardown_many(rt, ids, kill_wait=3, call_timeout=3, concurrency=8)
    finally:
        rt.close()


@pytest.mark.containerd
def test_agent_and_operator_run_the_node_story_with_their_service_accounts(
    installed: Installed,
    kube: client.ApiClient,
    control_plane: ControlPlane,
    containerd: PrivateContainerd,
    agent_ctr_ns: str,
    namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool with a Service: its member is scheduled, run by the agent and routed;
    a CachePrune is answered; the agent stops, its node is reaped after the grace
    and the member leaves the EndpointSlice; the agent comes back, tears the Dead
    member's container down and runs its replacement. Both programs hold only
    their own ServiceAccount's token, the agent's bound to a Pod on its node as a
    DaemonSet pod's is, under the chart's write policies."""
    caplog.set_level(logging.INFO, logger="sandlot")
    wipe_nodes(kube)
    node = f"chart-{uuid.uuid4().hex[:6]}"
    objs: Any = client.CustomObjectsApi(kube)
    discovery = client.DiscoveryV1Api(kube)
    agent_config = sa_kubeconfig(
        kube, control_plane, installed, "agent", tmp_path / "a.kubeconfig", node=node
    )
    op_config, op_identity = operator_replica(kube, control_plane, installed, tmp_path)
    agent_api = load_api_client(str(agent_config))
    agents: list[Agent] = []

    def start_agent() -> Agent:
        values: dict[str, Any] = {
            "node_name": node,
            "namespace": installed.namespace,
            "containerd_address": containerd.address,
            "containerd_namespace": agent_ctr_ns,
            "containerd_root": str(containerd.root),
            "lease_duration": "2s",
            "renew_interval": "0.5s",
            "kill_wait": "2s",
            "call_timeout": "2s",
            "stop_grace": "1s",
            "reap_interval": "1s",
            "sync_interval": "0.3s",
            "metrics_port": 0,
            "node_address": "10.9.8.7",
            "network_mode": "host-address",  # whatever the host's /etc/cni/net.d holds
            "log_dir": str(tmp_path / "logs"),
        }
        agent = Agent(AgentSettings(**values), agent_api, registry=CollectorRegistry())
        agents.append(agent)
        assert agent.start(), "agent start-up failed"
        return agent

    def members() -> list[dict[str, Any]]:
        out = objs.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", label_selector=f"{POOL_LABEL}=web"
        )
        return list(out["items"])

    def running() -> list[dict[str, Any]]:
        return [m for m in members() if (m.get("status") or {}).get("phase") == "Running"]

    def endpoints() -> list[str]:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=web"
        ).items
        return [a for sl in slices for ep in (sl.endpoints or []) for a in ep.addresses]

    op = OperatorProcess(
        control_plane,
        tmp_path,
        installed.namespace,
        "--grace-period",
        "3s",
        "--resync-interval",
        "1s",
        kubeconfig=op_config,
        identity=op_identity,
    )
    prune = f"prune-{uuid.uuid4().hex[:6]}"
    try:
        op.wait_metrics()
        first = start_agent()
        wait_for(
            lambda: (
                (
                    objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node).get(
                        "status"
                    )
                    or {}
                ).get("phase")
                == "Ready"
            ),
            timeout=20,
            what=f"node {node} Ready from the agent's Lease",
        )
        objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "sandboxpools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxPool",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "serviceName": "web",
                    "template": {
                        "spec": {
                            "image": AGENT_IMAGE,
                            "command": ["sleep", "1000"],
                            "ports": [{"containerPort": 8080}],
                        }
                    },
                },
            },
        )
        (member,) = wait_for(running, timeout=30, what="the pool's member Running")
        container = member["status"]["containerId"]
        wait_for(
            lambda: endpoints() == ["10.9.8.7"], timeout=20, what="the member in the EndpointSlice"
        )
        client.CoreV1Api(kube).read_namespaced_service("web", namespace)

        objs.create_cluster_custom_object(
            GROUP,
            VERSION,
            "cacheprunes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "CachePrune",
                "metadata": {"name": prune},
                "spec": {"all": True, "nodes": [node]},
            },
        )
        entry = wait_for(
            lambda: (
                (
                    objs.get_cluster_custom_object(GROUP, VERSION, "cacheprunes", prune).get(
                        "status"
                    )
                    or {}
                )
                .get("results", {})
                .get(node)
            ),
            timeout=20,
            what=f"CachePrune {prune} answered by {node}",
        )
        assert entry["pass"] == "forced" and not entry.get("error"), entry

        first.shutdown()  # the container keeps running; the Lease stops
        name = member["metadata"]["name"]

        def phase_of_member() -> str | None:
            found = [m for m in members() if m["metadata"]["name"] == name]
            return (found[0].get("status") or {}).get("phase") if found else "gone"

        wait_for(lambda: phase_of_member() == "Dead", timeout=30, what=f"{name} Dead")
        wait_for(lambda: endpoints() == [], timeout=20, what=f"{name} out of the EndpointSlice")

        second = start_agent()
        # start() returns after the sweep: the fenced container is gone already.
        assert container not in {c.id for c in list_containers(containerd, agent_ctr_ns)}
        assert second.registry.get_sample_value("sandlot_agent_fenced_total") == 1
        (replacement,) = wait_for(running, timeout=30, what="the replacement member Running")
        assert replacement["metadata"]["name"] != name
    finally:
        for agent in agents:
            agent.shutdown()
        op.stop()
        agent_api.close()
        with contextlib.suppress(client.ApiException):
            objs.delete_cluster_custom_object(GROUP, VERSION, "cacheprunes", prune)
        wipe_nodes(kube)

    denied = [r.getMessage() for r in caplog.records if FORBIDDEN.search(r.getMessage())]
    assert not denied, "the agent was refused:\n" + "\n".join(denied[:20])
    denied = [line for line in op.log_path.read_text().splitlines() if FORBIDDEN.search(line)]
    assert not denied, "the operator was refused:\n" + "\n".join(denied[:20])


def list_containers(containerd: PrivateContainerd, ns: str) -> list[Any]:
    from sandlot.adapters.containerd import ContainerdRuntime

    rt = ContainerdRuntime(containerd.address, ns)
    try:
        return list(rt.list_containers(timeout=10))
    finally:
        rt.close()
