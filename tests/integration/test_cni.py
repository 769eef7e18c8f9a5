"""Sandbox networking through CNI, for real: the OS's standard plugins
(``containernetworking-plugins``: bridge + host-local), a bridge and a private
subnet per xdist worker, real agents on the test containerd, the real control
plane and a real ``sandlot operator``.

Traffic goes only from this host to addresses on the test bridge, which live in
network namespaces the agents create for the test's sandboxes. Every wait has a
deadline and says what it waited for; the bridge is removed at the end.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.cni import NETNS_DIR, Attachment, SandboxNetwork
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import ContainerInfo, RuntimeError_
from sandlot.agent.main import Agent
from sandlot.agent.netsettings import NetworkMode
from sandlot.agent.settings import AgentSettings
from sandlot.agent.teardown import teardown_many
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from tests.support.containerd import PrivateContainerd
from tests.support.operator import Fleet
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

IMAGE = "docker.io/sandlot/cni-busybox:test"
HTTPD = [
    "sh",
    "-c",
    "mkdir -p /www && echo hello-$(busybox hostname) > /www/index.html "
    "&& exec busybox httpd -f -p 8080 -h /www",
]
SLEEPER = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']
PLUGIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni")
LEASE_SECONDS = 2
OPERATOR_FLAGS = ("--grace-period", "3s", "--resync-interval", "1s")
TERMINAL = ("Dead", "Stopped", "Failed")
# No proxy from the environment: the sandboxes are on the test bridge.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _plugin_dirs() -> str | None:
    found = [d for d in PLUGIN_DIRS if os.path.exists(os.path.join(d, "bridge"))]
    return ":".join(found) if found else None


@dataclass(frozen=True)
class BridgeNetwork:
    name: str
    bridge: str
    subnet: ipaddress.IPv4Network
    conf_dir: Path
    data_dir: Path
    bin_dirs: str

    def allocations(self) -> set[str]:
        """Addresses host-local holds: one file per address under its dataDir."""
        directory = self.data_dir / self.name
        if not directory.exists():
            return set()
        return {p.name for p in directory.iterdir() if _is_ip(p.name)}

    def veths(self) -> list[str]:
        out = subprocess.run(
            ["ip", "-o", "link", "show", "master", self.bridge],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def write_conflist(directory: Path, body: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "10-sandlot-test.conflist").write_text(json.dumps(body))


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeNetwork]:
    bin_dirs = _plugin_dirs()
    if bin_dirs is None or shutil.which("ip") is None:
        pytest.skip("the CNI plugins (containernetworking-plugins) or iproute2 are missing")
    # One bridge and subnet per test process: xdist workers, and two test runs on one
    # machine, must not see each other's veths or routes.
    n = os.getpid() % 250
    base = tmp_path_factory.mktemp("cni")
    net = BridgeNetwork(
        name=f"sltest{n}",
        bridge=f"sltest{n}",
        subnet=ipaddress.IPv4Network(f"10.77.{n}.0/24"),
        conf_dir=base / "net.d",
        data_dir=base / "ipam",
        bin_dirs=bin_dirs,
    )
    write_conflist(
        net.conf_dir,
        {
            "cniVersion": "1.0.0",
            "name": net.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": net.bridge,
                    "isGateway": True,
                    # A default route through the host, for traffic beyond the bridge
                    # (test_netpolicy's stand-ins in a namespace of their own).
                    "isDefaultGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(net.subnet)}]],
                        "dataDir": str(net.data_dir),
                    },
                }
            ],
        },
    )
    try:
        yield net
    finally:
        subprocess.run(["ip", "link", "del", net.bridge], capture_output=True, check=False)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cni-images") / "busybox.tar"
    build_image_archive(path, IMAGE)
    return path


@dataclass
class Node:
    name: str
    ctr_ns: str
    runtime: ContainerdRuntime
    conf_dir: Path
    agent: Agent | None = None
    allowed_egress: tuple[str, ...] = ()  # the cluster's openings into its blocked ranges

    def containers(self) -> list[ContainerInfo]:
        return self.runtime.list_containers(timeout=10)


@dataclass
class Harness:
    kube: client.ApiClient
    namespace: str
    lease_namespace: str
    containerd: PrivateContainerd
    archive: Path
    net: BridgeNetwork
    workdir: Path
    fleet: Fleet
    nodes: dict[str, Node] = field(default_factory=dict)

    @property
    def objs(self) -> Any:
        return client.CustomObjectsApi(self.kube)

    def add_node(
        self, suffix: str, *, conf_dir: Path | None = None, allowed_egress: tuple[str, ...] = ()
    ) -> Node:
        name = f"{self.fleet.prefix}-{suffix}"
        ctr_ns = f"cni-{uuid.uuid4().hex[:8]}"
        import_archive(self.containerd.address, ctr_ns, self.archive, timeout=60)
        node = Node(
            name,
            ctr_ns,
            ContainerdRuntime(self.containerd.address, ctr_ns),
            conf_dir or self.net.conf_dir,
            allowed_egress=allowed_egress,
        )
        self.nodes[name] = node
        self.fleet.nodes.append(name)
        self.start_agent(node)
        return node

    def start_agent(self, node: Node) -> Agent:
        settings = AgentSettings(
            default_ephemeral_storage_limit="",  # not about disk: no node-wide limit
            node_name=node.name,
            namespace=self.lease_namespace,
            containerd_address=self.containerd.address,
            containerd_namespace=node.ctr_ns,
            containerd_root=str(self.containerd.root),
            capacity=60,
            kill_wait=timedelta(seconds=2),
            # call_timeout: the product's (5 s); 25 starts at once on two loaded cores
            # can take containerd longer than 3 s to create one task.
            stop_grace=timedelta(seconds=1),
            reap_interval=timedelta(seconds=1),
            sync_interval=timedelta(seconds=0.3),
            lease_duration=timedelta(seconds=LEASE_SECONDS),
            renew_interval=timedelta(seconds=0.5),
            metrics_port=0,
            node_address="10.99.0.2",
            log_dir=str(self.workdir / "logs" / node.name),
            gc_disabled=True,
            network_mode=NetworkMode.CNI,
            cni_conf_dir=str(node.conf_dir),
            cni_bin_dir=self.net.bin_dirs,
            cni_timeout=timedelta(seconds=10),
            allowed_egress=list(node.allowed_egress),
        )
        agent = Agent(settings, self.kube, registry=CollectorRegistry())
        assert agent.start(), f"agent of {node.name} did not start"
        node.agent = agent
        return agent

    def stop_agent(self, node: Node) -> None:
        """The agent goes away without a word; its containers keep running."""
        assert node.agent is not None
        node.agent.shutdown()
        node.agent = None

    def sandbox(self, name: str, node: Node, command: list[str] = HTTPD) -> str:
        self.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": name},
                "spec": {
                    "image": IMAGE,
                    "nodeName": node.name,
                    "command": command,
                    "terminationGracePeriodSeconds": 1,
                },
            },
        )
        return name

    def get(self, name: str) -> dict[str, Any]:
        return dict(
            self.objs.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "sandboxes", name
            )
        )

    def delete(self, name: str) -> None:
        self.objs.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, "sandboxes", name)

    def create_pool(self, name: str, replicas: int, service: str) -> None:
        self.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxpools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxPool",
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "serviceName": service,
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {
                            "image": IMAGE,
                            "command": HTTPD,
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "terminationGracePeriodSeconds": 1,
                        },
                    },
                },
            },
        )

    def members(self, pool: str) -> list[dict[str, Any]]:
        out = self.objs.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sandboxes", label_selector=f"sandlot.dev/pool={pool}"
        )
        return list(out["items"])

    def slice_addresses(self, service: str) -> dict[str, str]:
        """Address -> sandbox name of each endpoint in the pool's EndpointSlice."""
        try:
            es = client.DiscoveryV1Api(self.kube).read_namespaced_endpoint_slice(
                f"{service}-sandlot", self.namespace
            )
        except ApiException as e:
            if e.status == 404:
                return {}
            raise
        return {
            a: e.target_ref.name
            for e in es.endpoints or []
            if e.target_ref and e.target_ref.name
            for a in e.addresses
        }

    def cleanup(self) -> None:
        for kind in ("sandboxpools", "sandboxes"):
            try:
                self.objs.delete_collection_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, kind
                )
            except ApiException as e:
                if e.status != 404:
                    raise
        network = SandboxNetwork(str(self.net.conf_dir), self.net.bin_dirs, timeout=10)
        for node in self.nodes.values():
            if node.agent is not None:
                node.agent.shutdown()
            with contextlib.suppress(RuntimeError_):
                teardown_many(
                    node.runtime,
                    node.containers(),
                    kill_wait=3,
                    call_timeout=3,
                    concurrency=8,
                    release=lambda c: _detach(network, c),
                )
            node.runtime.close()


def _detach(network: SandboxNetwork, container: ContainerInfo | str) -> None:
    assert isinstance(container, ContainerInfo)
    attachment = Attachment.from_labels(container.id, container.labels)
    if attachment is not None:
        network.detach(attachment)


def phase(sb: dict[str, Any]) -> str:
    return str((sb.get("status") or {}).get("phase") or "Pending")


def status(sb: dict[str, Any], key: str) -> Any:
    return (sb.get("status") or {}).get(key)


def netns_names() -> set[str]:
    try:
        return set(os.listdir(NETNS_DIR))
    except OSError:
        return set()


def fetch(ip: str, timeout: float = 15) -> str:
    """GET the sandbox's page from this host, over the bridge; retried to a deadline."""

    def probe() -> str | None:
        try:
            with HTTP.open(f"http://{ip}:8080/index.html", timeout=2) as r:
                return str(r.read().decode().strip())
        except OSError as exc:
            raise AssertionError(f"GET {ip}:8080: {exc}") from None

    return wait_for(probe, timeout=timeout, what=f"the page of {ip}:8080", interval=0.2)


@pytest.fixture
def harness(
    kube: client.ApiClient,
    namespace: str,
    lease_namespace: str,
    containerd: PrivateContainerd,
    archive: Path,
    network: BridgeNetwork,
    fleet: Fleet,
    tmp_path: Path,
) -> Iterator[Harness]:
    h = Harness(kube, namespace, lease_namespace, containerd, archive, network, tmp_path, fleet)
    yield h
    h.cleanup()


# ------------------------------------------------------------------------------ tests


def test_pool_members_serve_on_their_own_addresses_and_release_them_when_dead(
    harness: Harness, operators: Any
) -> None:
    net = harness.net
    a, b = harness.add_node("a"), harness.add_node("b")
    op = operators(*OPERATOR_FLAGS)
    wait_for(op.is_leader, timeout=30, what="the operator to lead")
    harness.create_pool("web", 4, "web")

    def running() -> list[dict[str, Any]] | None:
        members = [m for m in harness.members("web") if phase(m) not in TERMINAL]
        up = [m for m in members if phase(m) == "Running"]
        return up if len(up) == 4 and len(members) == 4 else None

    members = wait_for(running, timeout=60, what="4 Running members of pool web")
    ips = {status(m, "ip"): m["metadata"]["name"] for m in members}
    assert len(ips) == 4, f"members share addresses: {ips}"
    assert all(ipaddress.ip_address(ip) in net.subnet for ip in ips), ips
    wait_for(
        lambda: harness.slice_addresses("web") == ips,
        timeout=15,
        what=f"the EndpointSlice to list {ips}",
    )
    for ip, name in ips.items():
        assert fetch(ip) == f"hello-{name}", f"{ip} is not {name}'s"
    assert set(ips) <= net.allocations()

    lost = {status(m, "ip"): m for m in members if m["spec"]["nodeName"] == a.name}
    assert lost, "the pool put nothing on node a"
    lost_containers = {status(m, "containerId") for m in lost.values()}
    harness.stop_agent(a)
    wait_for(
        lambda: all(phase(harness.get(m["metadata"]["name"])) == "Dead" for m in lost.values()),
        timeout=30,
        what="node a's members Dead",
    )
    wait_for(
        lambda: not set(lost) & set(harness.slice_addresses("web")),
        timeout=15,
        what=f"the Dead members' addresses {sorted(lost)} gone from the EndpointSlice",
    )
    replaced = wait_for(running, timeout=60, what="4 Running members again, on node b")
    assert {m["spec"]["nodeName"] for m in replaced} == {b.name}
    for m in replaced:
        assert fetch(status(m, "ip")) == f"hello-{m['metadata']['name']}"
    # Node a is away: its containers still run and hold their addresses.
    assert set(lost) <= net.allocations()

    harness.start_agent(a)  # it fences its Dead sandboxes: teardown, CNI DEL, netns removed
    wait_for(
        lambda: not set(lost) & net.allocations(),
        timeout=30,
        what=f"host-local to release {sorted(lost)}",
    )
    wait_for(lambda: not a.containers(), timeout=15, what="node a's containers gone")
    assert not {f"sandlot-{c}" for c in lost_containers} & netns_names()


def test_restart_keeps_addresses_and_the_sweep_releases_what_a_crashed_agent_left(
    harness: Harness,
) -> None:
    net = harness.net
    node = harness.add_node("a")
    for name in ("kept", "deleted", "fenced"):
        harness.sandbox(name, node)
    wait_for(
        lambda: all(phase(harness.get(n)) == "Running" for n in ("kept", "deleted", "fenced")),
        timeout=30,
        what="3 sandboxes Running",
    )
    before = {n: harness.get(n) for n in ("kept", "deleted", "fenced")}
    ips = {n: status(sb, "ip") for n, sb in before.items()}
    for n, ip in ips.items():
        assert fetch(ip) == f"hello-{n}"

    harness.stop_agent(node)  # an agent crash, as far as the sandboxes can tell
    harness.delete("deleted")
    harness.objs.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        harness.namespace,
        "sandboxes",
        "fenced",
        {"status": {"phase": "Dead", "reason": "NodeLost"}},
    )
    harness.start_agent(node)  # sweep: one orphan, one fenced; re-adopt "kept"

    gone = {ips["deleted"], ips["fenced"]}
    assert not gone & net.allocations(), "the sweep left addresses allocated"
    cids = {n: status(sb, "containerId") for n, sb in before.items()}
    assert {c.id for c in node.containers()} == {cids["kept"]}
    names = netns_names()
    assert f"sandlot-{cids['kept']}" in names
    assert not {f"sandlot-{cids['deleted']}", f"sandlot-{cids['fenced']}"} & names
    kept = harness.get("kept")
    assert phase(kept) == "Running" and status(kept, "ip") == ips["kept"]
    assert fetch(ips["kept"]) == "hello-kept", "the re-adopted sandbox lost its network"
    assert len(net.veths()) == 1, f"veths on {net.bridge}: {net.veths()}"


def test_a_failed_add_fails_the_sandbox_with_the_plugins_message_and_leaks_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.d"
    write_conflist(
        broken,
        {
            "cniVersion": "1.0.0",
            "name": f"{harness.net.name}-broken",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": harness.net.bridge,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.300.0/24"}]]},
                }
            ],
        },
    )
    node = harness.add_node("broken", conf_dir=broken)
    harness.sandbox("s", node)
    sb = wait_for(
        lambda: (lambda s: s if phase(s) in TERMINAL else None)(harness.get("s")),
        timeout=30,
        what="the sandbox to end",
    )
    assert phase(sb) == "Failed" and status(sb, "reason") == "NetworkSetupFailed", sb["status"]
    message = status(sb, "message")
    assert "CNI plugin bridge ADD failed" in message and "10.77.300.0" in message, message
    wait_for(lambda: not node.containers(), timeout=15, what="the container torn down")
    assert not {n for n in netns_names() if n.startswith("sandlot-sb-")} & {
        f"sandlot-sb-{sb['metadata']['uid']}"
    }


def test_fifty_sandboxes_created_and_torn_down_leave_no_namespace_veth_or_address(
    harness: Harness,
) -> None:
    net = harness.net
    node = harness.add_node("churn")
    seen_ips: set[str] = set()
    containers: set[str] = set()
    for round_ in range(2):
        names = [harness.sandbox(f"c{round_}-{i}", node, SLEEPER) for i in range(25)]

        def up(names: list[str] = names) -> list[dict[str, Any]] | None:
            sbs = [harness.get(n) for n in names]
            failed = [s for s in sbs if phase(s) in TERMINAL]
            assert not failed, f"ended: {[(s['metadata']['name'], s['status']) for s in failed]}"
            return sbs if all(phase(s) == "Running" for s in sbs) else None

        sbs = wait_for(up, timeout=90, what=f"round {round_}: 25 sandboxes Running")
        ips = {status(s, "ip") for s in sbs}
        assert len(ips) == 25 and all(ipaddress.ip_address(i) in net.subnet for i in ips)
        assert ips <= net.allocations()
        seen_ips |= ips
        containers |= {status(s, "containerId") for s in sbs}
        for n in names:
            harness.delete(n)
        wait_for(lambda: not node.containers(), timeout=90, what=f"round {round_}: containers gone")
    assert len(containers) == 50
    assert not {f"sandlot-{c}" for c in containers} & netns_names(), "netns left behind"
    assert net.veths() == [], f"veths left on {net.bridge}: {net.veths()}"
    assert net.allocations() == set(), f"addresses still allocated: {net.allocations()}"
