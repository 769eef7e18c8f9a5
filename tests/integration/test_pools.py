"""Scheduling, pools, routing and drain end to end: a real ``sandlot operator``
process on the real control plane, and real agents (in-process, each with its own
containerd namespace on the test containerd) running real containers.

Agents renew a 2 s lease every 0.5 s and the operator's grace is 3 s, so a lost
node's sandboxes go Dead about 5 s after its agent's last renewal. Every wait has
a deadline and says what it waited for.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
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
from tests.support.containerd import PrivateContainerd
from tests.support.operator import Fleet
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

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
            kill_wait="2s",
            call_timeout="2s",
            stop_grace="2s",
            reap_interval="1s",
            sync_interval="0.3s",
            lease_duration=f"{LEASE_SECONDS}s",
            renew_interval="0.5s",
            metrics_port=0,
            node_address=node.address,
            log_dir=str(self.workdir / "logs" / node.name),
            gc_disabled=True,
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
        self, name: str, replicas: int, *, service: str | None = None, history: int = 10
    ) -> None:
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
        return {e.target_ref.name for e in es.endpoints or []}

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


def start_operator(cluster: Cluster, operators: Start) -> Any:
    op = operators(*OPERATOR_FLAGS)
    wait_for(op.is_leader, timeout=30, what="the operator to lead")
    for name in cluster.nodes:
        wait_for(
            lambda n=name: cluster.node_phase(n) == "Ready",
            timeout=20,
            what=f"node {name} Ready",
        )
    return op


# ------------------------------------------------------------------------------ tests


def test_pool_spreads_routes_and_replaces_the_members_of_a_lost_node(
    cluster: Cluster, operators: Start
) -> None:
    a, b, c = (cluster.add_node(n) for n in ("a", "b", "c"))
    start_operator(cluster, operators)
    cluster.create_pool("web", 6, service="web")

    running = cluster.wait_running("web", 6)
    spread = Counter(node_of(m) for m in running)
    assert spread == {a.name: 2, b.name: 2, c.name: 2}, f"not spread 2/2/2: {spread}"
    names = {m["metadata"]["name"] for m in running}
    wait_for(
        lambda: cluster.slice_targets("web") == names,
        timeout=10,
        what="the EndpointSlice to list the 6 Running members",
    )
    es = client.DiscoveryV1Api(cluster.kube).read_namespaced_endpoint_slice(
        "web-sandlot", cluster.namespace
    )
    assert es.metadata.labels["kubernetes.io/service-name"] == "web"
    assert es.metadata.labels["endpointslice.kubernetes.io/managed-by"] == "sandlot.dev"
    assert es.address_type == "IPv4"
    assert [(p.name, p.port, p.protocol) for p in es.ports] == [("http", 8080, "TCP")]
    by_name = {m["metadata"]["name"]: m for m in running}
    for ep in es.endpoints:
        member = by_name[ep.target_ref.name]
        assert ep.addresses == [member["status"]["ip"]]
        assert ep.conditions.ready is True
        assert ep.node_name == node_of(member)
        assert (ep.target_ref.kind, ep.target_ref.uid) == ("Sandbox", member["metadata"]["uid"])
    pool = cluster.pool("web")
    svc = client.CoreV1Api(cluster.kube).read_namespaced_service("web", cluster.namespace)
    assert svc.spec.selector is None
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("http", 8080, 8080)]
    for owned in (svc.metadata, es.metadata):
        (ref,) = owned.owner_references
        assert (ref.kind, ref.uid, ref.controller) == ("SandboxPool", pool["metadata"]["uid"], True)
    member = running[0]
    (ref,) = member["metadata"]["ownerReferences"]
    assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
        pool["metadata"]["uid"],
        True,
        True,
    )
    assert member["metadata"]["labels"] == {"app": "web", "sandlot.dev/pool": "web"}
    assert member["metadata"]["name"].startswith("web-")
    wait_for(
        lambda: cluster.pool("web").get("status", {}).get("running") == 6,
        timeout=10,
        what="pool status running=6",
    )
    status = cluster.pool("web")["status"]
    assert (status["replicas"], status["pending"], status["dead"]) == (6, 0, 0)
    assert status["selector"] == "sandlot.dev/pool=web"

    # Lose node a: its agent stops renewing; its containers keep running.
    lost = {
        m["metadata"]["name"]: m["status"]["containerId"] for m in running if node_of(m) == a.name
    }
    last_renew = cluster.kill_agent(a)
    grace_end = last_renew + timedelta(seconds=LEASE_SECONDS + GRACE_SECONDS)
    out_of_slice: float | None = None
    replaced: float | None = None
    deadline = time.monotonic() + 40
    while out_of_slice is None or replaced is None:
        assert time.monotonic() < deadline, (
            f"lost members not out of the slice ({out_of_slice}) or not replaced ({replaced}) "
            f"within 40s; slice: {cluster.slice_targets('web')}"
        )
        now = datetime.now(UTC)
        if out_of_slice is None:
            targets = cluster.slice_targets("web") or set()
            if not targets & set(lost):
                out_of_slice = (now - grace_end).total_seconds()
        if replaced is None:
            live = cluster.live("web")
            if (
                len(live) == 6
                and all(phase(m) == "Running" for m in live)
                and not any(node_of(m) == a.name for m in live)
            ):
                replaced = (now - grace_end).total_seconds()
        time.sleep(0.05)
    print(
        f"\npool of 6, lease {LEASE_SECONDS}s, grace {GRACE_SECONDS}s: from grace expiry, "
        f"lost members out of the EndpointSlice after {out_of_slice:.2f}s, "
        f"replacements Running after {replaced:.2f}s"
    )
    members = {m["metadata"]["name"]: m for m in cluster.members("web")}
    for name in lost:
        assert phase(members[name]) == "Dead"
        assert members[name]["status"]["reason"] == "NodeLost"
    live = cluster.live("web")
    assert Counter(node_of(m) for m in live) == {b.name: 3, c.name: 3}
    wait_for(
        lambda: cluster.slice_targets("web") == {m["metadata"]["name"] for m in live},
        timeout=10,
        what="the EndpointSlice to list exactly the 6 live members",
    )
    # The lost node's containers are still there, never stopped: nobody could reach
    # them. (A shim slow to answer under load is listed UNKNOWN, not RUNNING.)
    tasks = a.tasks()
    assert set(lost.values()) <= a.containers(), (lost, a.containers())
    assert all(tasks.get(cid) in (TaskState.RUNNING, TaskState.UNKNOWN) for cid in lost.values()), (
        tasks
    )

    # The agent comes back: it fences itself, tearing the Dead members' containers down.
    cluster.start_agent(a)
    wait_for(
        lambda: not (a.containers() & set(lost.values())),
        timeout=20,
        what="the restarted agent to tear down the Dead members' containers",
    )
    members = {m["metadata"]["name"]: m for m in cluster.members("web")}
    assert all(phase(members[n]) == "Dead" for n in lost)
    assert cluster.pool("web")["status"]["dead"] == 2


def test_drain_moves_members_off_the_node_and_none_goes_dead(
    cluster: Cluster, operators: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = (cluster.add_node(n) for n in ("a", "b", "c"))
    start_operator(cluster, operators)
    cluster.create_pool("api", 6, service="api")
    running = cluster.wait_running("api", 6)
    on_a = {m["metadata"]["name"] for m in running if node_of(m) == a.name}
    assert len(on_a) == 2

    assert cluster.sandlot("drain", a.name, "--timeout", "60s") == 0
    out = capsys.readouterr().out
    assert f"sandboxes still on {a.name}" in out, out
    assert f"node {a.name} drained" in out

    members = {m["metadata"]["name"]: m for m in cluster.members("api")}
    for name in on_a:
        assert (phase(members[name]), members[name]["status"]["reason"]) == ("Stopped", "Drained")
    assert not [n for n, m in members.items() if phase(m) == "Dead"]
    live = cluster.wait_running("api", 6)
    assert Counter(node_of(m) for m in live) == {b.name: 3, c.name: 3}
    assert not a.containers(), "the drained node's containers should be gone"
    wait_for(
        lambda: cluster.slice_targets("api") == {m["metadata"]["name"] for m in live},
        timeout=10,
        what="the EndpointSlice to list the members on b and c only",
    )
    wait_for(lambda: cluster.node_phase(a.name) == "Disabled", timeout=10, what="a Disabled")
    time.sleep(LEASE_SECONDS + GRACE_SECONDS)  # a whole grace period: nothing may go Dead
    assert not [m for m in cluster.members("api") if phase(m) == "Dead"]

    assert cluster.sandlot("uncordon", a.name) == 0
    wait_for(lambda: cluster.node_phase(a.name) == "Ready", timeout=10, what="a Ready again")


def test_drain_times_out_naming_what_is_left(fleet: Fleet, capsys, control_plane) -> None:
    node = fleet.node("gone")  # no agent: nothing will stop its sandbox
    fleet.sandbox("stuck", node, "Running")
    code = sandlot_main(
        ["drain", node, "--timeout", "1s", "--kubeconfig", str(control_plane.kubeconfig)]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert f"1 sandboxes still on {node}" in out
    assert f"{fleet.namespace}/stuck" in out and "timed out" in out
    assert fleet.get_node(node)["spec"]["unschedulable"] is True


def test_full_node_gets_nothing_more_and_the_sandbox_waits_saying_why(
    cluster: Cluster, operators: Start
) -> None:
    a = cluster.add_node("a", capacity=2)
    start_operator(cluster, operators)
    cluster.create_pool("batch", 3)

    def waiting() -> dict[str, Any] | None:
        pending = [m for m in cluster.members("batch") if phase(m) == "Pending"]
        if len(pending) != 1:
            return None
        cond = next(
            (
                c
                for c in (pending[0].get("status") or {}).get("conditions", [])
                if c["type"] == "Scheduled"
            ),
            None,
        )
        return pending[0] if cond and cond["status"] == "False" else None

    stuck = wait_for(waiting, timeout=30, what="one member Pending with Scheduled=False")
    cond = next(c for c in stuck["status"]["conditions"] if c["type"] == "Scheduled")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == "0/1 nodes are available: 1 at capacity"
    assert node_of(stuck) is None
    wait_for(
        lambda: len([m for m in cluster.running("batch") if node_of(m) == a.name]) == 2,
        timeout=20,
        what="the two members that fit Running on the full node",
    )
    wait_for(
        lambda: cluster.pool("batch").get("status", {}).get("pending") == 1,
        timeout=10,
        what="pool status pending=1",
    )

    # Room appears (a new node becomes Ready): the waiting member is placed there.
    b = cluster.add_node("b", capacity=2)
    running = cluster.wait_running("batch", 3, timeout=30)
    assert Counter(node_of(m) for m in running) == {a.name: 2, b.name: 1}
    placed = next(m for m in running if m["metadata"]["name"] == stuck["metadata"]["name"])
    assert node_of(placed) == b.name


def test_scale_subresource_scales_up_and_down_and_removes_containers(
    cluster: Cluster, operators: Start, kubectl
) -> None:
    a, b = cluster.add_node("a"), cluster.add_node("b")
    start_operator(cluster, operators)
    cluster.create_pool("svc", 2, service="svc")
    cluster.wait_running("svc", 2)

    kubectl("scale", "-n", cluster.namespace, "sbpool/svc", "--replicas=5")
    five = cluster.wait_running("svc", 5)
    first = sorted(five, key=lambda m: m["metadata"]["creationTimestamp"])

    kubectl("scale", "-n", cluster.namespace, "sbpool/svc", "--replicas=1")
    wait_for(lambda: len(cluster.members("svc")) == 1, timeout=30, what="4 members deleted")
    (kept,) = cluster.members("svc")
    assert kept["metadata"]["creationTimestamp"] == first[0]["metadata"]["creationTimestamp"]
    keep_container = kept["status"]["containerId"]
    wait_for(
        lambda: (a.containers() | b.containers()) == {keep_container},
        timeout=30,
        what="the deleted members' containers to be removed",
    )
    wait_for(
        lambda: cluster.slice_targets("svc") == {kept["metadata"]["name"]},
        timeout=10,
        what="the EndpointSlice to list the one member left",
    )
    scale = kubectl(
        "get", "-n", cluster.namespace, "sbpool/svc", "-o", "jsonpath={.status.replicas}"
    ).stdout
    assert scale == "1"


def test_binding_with_a_stale_resource_version_never_rebinds(
    kube: client.ApiClient, namespace: str
) -> None:
    from sandlot.adapters.objects import Objects
    from sandlot.adapters.workloads import bind_sandbox

    objs: Any = client.CustomObjectsApi(kube)
    created = objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": "once"},
            "spec": {"image": IMAGE},
        },
    )
    rv = created["metadata"]["resourceVersion"]
    objects = Objects(kube)
    first = bind_sandbox(objects, namespace, "once", "n1", rv)
    second = bind_sandbox(objects, namespace, "once", "n2", rv)  # a second pass, same read
    assert first.outcome == "bound"
    assert second.outcome == "taken"
    assert second.body is not None and second.body["spec"]["nodeName"] == "n1"
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "once", {"status": {"phase": "Pending"}}
    )
    # Changed but still unbound elsewhere: a conflict the caller retries with the new version.
    other = objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": "moved"},
            "spec": {"image": IMAGE},
        },
    )
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", "moved", {"status": {"phase": "Pending"}}
    )
    stale = bind_sandbox(objects, namespace, "moved", "n1", other["metadata"]["resourceVersion"])
    assert stale.outcome == "conflict" and stale.body is not None
    retried = bind_sandbox(
        objects, namespace, "moved", "n1", stale.body["metadata"]["resourceVersion"]
    )
    assert retried.outcome == "bound"
