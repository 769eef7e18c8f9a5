"""A cluster for pool tests: a real ``sandlot operator`` process on the real control
plane, and real agents (in-process, each with its own containerd namespace on the
test containerd) running real containers.

Agents renew a 2 s lease every 0.5 s and the operator's grace is 3 s, so a lost
node's sandboxes go Dead about 5 s after its agent's last renewal. Every wait has
a deadline and says what it waited for.

Fixtures, imported by name into a test module: ``pool_archive`` (module), the pool
image's archive; ``cluster`` (function), a ``Cluster`` cleaned up after the test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.objects import Leases
from sandlot.adapters.runtime import RuntimeError_, TaskState
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.agent.teardown import teardown_many
from sandlot.api.common import GROUP, VERSION
from sandlot.cli.main import main as sandlot_main
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from tests.support.agents import NOT_ABOUT_DISK
from tests.support.containerd import PrivateContainerd
from tests.support.operator import Fleet
from tests.support.wait import wait_for

IMAGE = "docker.io/sandlot/pool-busybox:test"
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']
LEASE_SECONDS = 2
GRACE_SECONDS = 3
OPERATOR_FLAGS = ("--grace-period", f"{GRACE_SECONDS}s", "--resync-interval", "1s")
TERMINAL = ("Dead", "Stopped", "Failed")


@pytest.fixture(scope="module")
def pool_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pool-images") / "busybox.tar"
    build_image_archive(path, IMAGE)
    return path


@dataclass
class LocalNode:
    name: str
    ctr_ns: str
    address: str
    capacity: int
    agent: Agent | None = None
    runtime: ContainerdRuntime | None = None

    def tasks(self) -> dict[str, TaskState]:
        assert self.runtime is not None
        return {t.container_id: t.state for t in self.runtime.list_tasks(timeout=10)}

    def containers(self) -> set[str]:
        assert self.runtime is not None
        return {c.id for c in self.runtime.list_containers(timeout=10)}


@dataclass
class Cluster:
    """Agents on one containerd, and the API objects of one test."""

    kube: client.ApiClient
    namespace: str
    lease_namespace: str
    containerd: PrivateContainerd
    archive: Path
    workdir: Path
    fleet: Fleet
    kubeconfig: Path
    nodes: dict[str, LocalNode] = field(default_factory=dict)
    agent_overrides: dict[str, Any] = field(default_factory=dict)
    """More settings for every agent started (a state repository, say)."""
    operator_flags: tuple[str, ...] = ()
    """More flags for the operator ``start_operator`` starts (its state repository)."""

    @property
    def objs(self) -> Any:
        return client.CustomObjectsApi(self.kube)

    def add_node(self, suffix: str, *, capacity: int = 20) -> LocalNode:
        name = f"{self.fleet.prefix}-{suffix}"
        ctr_ns = f"pool-{uuid.uuid4().hex[:8]}"
        import_archive(self.containerd.address, ctr_ns, self.archive, timeout=60)
        node = LocalNode(name, ctr_ns, f"10.99.0.{len(self.nodes) + 2}", capacity)
        node.runtime = ContainerdRuntime(self.containerd.address, ctr_ns)
        self.nodes[name] = node
        self.fleet.nodes.append(name)  # the fleet removes the SandboxNode afterwards
        self.start_agent(node)
        return node

    def start_agent(self, node: LocalNode) -> Agent:
        settings = AgentSettings(
            node_name=node.name,
            namespace=self.lease_namespace,
            containerd_address=self.containerd.address,
            containerd_namespace=node.ctr_ns,
            containerd_root=str(self.containerd.root),
            capacity=node.capacity,
            kill_wait=timedelta(seconds=2),
            call_timeout=timedelta(seconds=2),
            stop_grace=timedelta(seconds=2),
            reap_interval=timedelta(seconds=1),
            sync_interval=timedelta(seconds=0.3),
            lease_duration=timedelta(seconds=LEASE_SECONDS),
            renew_interval=timedelta(seconds=0.5),
            metrics_port=0,
            node_address=node.address,
            log_dir=str(self.workdir / "logs" / node.name),
            gc_disabled=True,
            # Whatever the host's /etc/cni/net.d holds: CNI only where a test names it.
            **{"network_mode": "host-address", **NOT_ABOUT_DISK, **self.agent_overrides},
        )
        agent = Agent(settings, self.kube, registry=CollectorRegistry())
        assert agent.start(), f"agent of {node.name} did not start"
        node.agent = agent
        return agent

    def kill_agent(self, node: LocalNode) -> datetime:
        """Stop the agent without a word: the lease just stops being renewed and its
        containers keep running. Returns the lease's last renewTime."""
        assert node.agent is not None
        node.agent.shutdown()
        node.agent = None
        lease = Leases(self.kube, self.lease_namespace).get(node.name)
        assert lease is not None and lease.renew_time is not None
        return lease.renew_time

    def create_pool(
        self,
        name: str,
        replicas: int,
        *,
        service: str | None = None,
        history: int = 10,
        **template: Any,
    ) -> None:
        """``template``: more fields of the members' spec (camelCase)."""
        spec: dict[str, Any] = {
            "replicas": replicas,
            "historyLimit": history,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "image": IMAGE,
                    "command": SLEEPER,
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "terminationGracePeriodSeconds": 1,
                    **template,
                },
            },
        }
        if service:
            spec["serviceName"] = service
        self.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxpools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxPool",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def create_claim(self, name: str, pool: str, lifecycle: dict[str, Any] | None = None) -> None:
        """A SandboxClaim ``name`` on ``pool``, with ``lifecycle`` as its spec's if given."""
        spec: dict[str, Any] = {"poolName": pool}
        if lifecycle is not None:
            spec["lifecycle"] = lifecycle
        self.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxclaims",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxClaim",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def claim_status(self, name: str) -> dict[str, Any]:
        body = self.objs.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sandboxclaims", name
        )
        return dict(body.get("status") or {})

    def pool(self, name: str) -> dict[str, Any]:
        return dict(
            self.objs.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "sandboxpools", name
            )
        )

    def members(self, pool: str) -> list[dict[str, Any]]:
        out = self.objs.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sandboxes", label_selector=f"sandlot.dev/pool={pool}"
        )
        return list(out["items"])

    def live(self, pool: str) -> list[dict[str, Any]]:
        return [m for m in self.members(pool) if phase(m) not in TERMINAL]

    def running(self, pool: str) -> list[dict[str, Any]]:
        return [m for m in self.members(pool) if phase(m) == "Running"]

    def wait_running(self, pool: str, count: int, timeout: float = 40) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            live = self.live(pool)
            running = [m for m in live if phase(m) == "Running"]
            if len(running) == count and len(live) == count:
                return running
            return None

        return wait_for(probe, timeout=timeout, what=f"{count} Running members of pool {pool}")

    def slice_targets(self, service: str) -> set[str] | None:
        try:
            es = client.DiscoveryV1Api(self.kube).read_namespaced_endpoint_slice(
                f"{service}-sandlot", self.namespace
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {e.target_ref.name for e in es.endpoints or [] if e.target_ref and e.target_ref.name}

    def node_phase(self, name: str) -> str | None:
        return (self.fleet.get_node(name).get("status") or {}).get("phase")

    def sandlot(self, *argv: str) -> int:
        return sandlot_main([*argv, "--kubeconfig", str(self.kubeconfig)])

    def cleanup(self) -> None:
        # No garbage collector runs in the test control plane: remove what the
        # pools made, so no later operator in this worker reconciles them.
        for kind in ("sandboxpools", "sandboxes"):
            try:
                self.objs.delete_collection_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, kind
                )
            except ApiException as e:
                if e.status != 404:
                    raise
        for node in self.nodes.values():
            if node.agent is not None:
                node.agent.shutdown()
            if node.runtime is not None:
                try:
                    ids = list(node.containers())
                    teardown_many(node.runtime, ids, kill_wait=3, call_timeout=3, concurrency=8)
                except RuntimeError_:
                    pass
                node.runtime.close()


def phase(sb: dict[str, Any]) -> str:
    return str((sb.get("status") or {}).get("phase") or "Pending")


def node_of(sb: dict[str, Any]) -> str | None:
    return (sb.get("spec") or {}).get("nodeName")


def wipe_leftovers(kube: client.ApiClient) -> None:
    """Pools and unbound sandboxes that earlier tests in this worker's control plane
    left behind (namespaces are never emptied here: no namespace controller) would
    be scheduled onto this test's nodes."""
    objs: Any = client.CustomObjectsApi(kube)
    for kind in ("sandboxpools", "sandboxes"):
        for item in objs.list_cluster_custom_object(GROUP, VERSION, kind)["items"]:
            if kind == "sandboxes" and node_of(item):
                continue
            meta = item["metadata"]
            try:
                objs.delete_namespaced_custom_object(
                    GROUP, VERSION, meta["namespace"], kind, meta["name"]
                )
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def cluster(
    kube: client.ApiClient,
    control_plane: Any,
    namespace: str,
    lease_namespace: str,
    containerd: PrivateContainerd,
    pool_archive: Path,
    fleet: Fleet,
    tmp_path: Path,
) -> Iterator[Cluster]:
    wipe_leftovers(kube)
    c = Cluster(
        kube,
        namespace,
        lease_namespace,
        containerd,
        pool_archive,
        tmp_path,
        fleet,
        Path(control_plane.kubeconfig),
    )
    yield c
    c.cleanup()


Start = Callable[..., Any]


def _ready(cluster: Cluster, node: str) -> bool:
    return cluster.node_phase(node) == "Ready"


def start_operator(cluster: Cluster, operators: Start) -> Any:
    op = operators(*OPERATOR_FLAGS, *cluster.operator_flags)
    wait_for(op.is_leader, timeout=30, what="the operator to lead")
    for name in cluster.nodes:
        wait_for(partial(_ready, cluster, name), timeout=20, what=f"node {name} Ready")
    return op
