"""sandlot on the local kubelet cluster (``sandlot.devtools.cluster``): a control
plane with kube-controller-manager and kube-scheduler, two nodes each running its
own containerd (CRI on: worker1 the OS package, 1.6; worker2 2.x, built from its
module) and kubelet in namespaces of their own, the sandlot image built here from
the Dockerfile's recipe and imported, the chart installed by helm, with gVisor
installed by its value on worker2 alone (from the runtimes image, imported there).
The scenarios of e2e/scenarios.py run in order on one cluster
(one xdist group), a node stopped by killing everything it runs (containerd,
kubelet, agent, sandboxes) and booted again.

Runs in ``make test``: everything it needs is built by ``make setup`` and cached
(kubelet and kube-scheduler by version, the images by a hash of their inputs).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from packaging.utils import canonicalize_name
from packaging.version import Version
from tests.support.locks import RUNTIME_LOCK, pins
from tests.support.wait import wait_for

from e2e.agentsandbox import agent_sandboxs_client_runs_unchanged
from e2e.runtimes import a_gvisor_sandbox_runs_on_gvisor_s_kernel
from e2e.scenarios import (
    NAMESPACE,
    ROOT,
    SANDBOX_IMAGE,
    VALUES,
    WORKLOADS,
    Cluster,
    a_pool_spreads_over_the_workers,
    a_stopped_workers_sandboxes_go_dead_and_are_replaced,
    a_tenant_with_edit_streams_through_the_gateway,
    assert_chart_pods_ready,
    cache_clear_reports_per_node,
    helm_uninstall_leaves_nothing,
    helm_upgrade_rolls_every_program_keeping_sandboxes,
    install,
    merged,
    pool_running,
)
from sandlot.adapters.kube import load_api_client
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.cluster import LocalCluster
from sandlot.devtools.cluster.commands import IMAGE as CLUSTER_IMAGE
from sandlot.devtools.cluster.images import (
    PAUSE_IMAGE,
    RECIPE,
    RUNTIMES_IMAGE,
    pause_archive,
    runtimes_archive,
    sandlot_archive,
)
from sandlot.devtools.ociarchive import build_image_archive, import_archive

NEEDED = ("containerd", "runc", "ctr", "nsenter", "unshare", "ip", "gcc", "debootstrap")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the local cluster needs root (network and mount namespaces, containers)"
    missing = [b for b in NEEDED if shutil.which(b) is None]
    if missing:
        return f"the local cluster needs {', '.join(missing)} (run `make setup` as root)"
    return None


REASON = _unavailable()
if REASON is not None:
    pytest.skip(REASON, allow_module_level=True)

# The first test also builds (or finds cached) the images and boots the cluster.
pytestmark = [pytest.mark.xdist_group("local-cluster"), pytest.mark.timeout(1800)]

# The name `make setup` builds it under, so a test run reuses that archive.
IMAGE_NAME = CLUSTER_IMAGE
# Probes tightened so that the probe scenarios see the kubelet act within seconds.
PROBE = {"periodSeconds": 3, "timeoutSeconds": 3, "failureThreshold": 3}
LIVENESS = {"periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 4}
LEADER_LEASE = "sandlot-operator"
# A standby takes over within the leader Lease's duration plus one retry period
# (the chart's 12 s and 2 s), here with room for a loaded machine's API server.
TAKEOVER_S = 12 + 2 + 16
# worker2 runs containerd 2.x (gVisor's shim speaks its shim protocol only) and is
# the one node the chart installs gVisor on, from the runtimes image imported there.
GVISOR_NODE = "worker2"
CONTAINERD2_LABEL = ("e2e.sandlot.dev/containerd", "2")
RUNTIMES_REPOSITORY, RUNTIMES_TAG = RUNTIMES_IMAGE.rsplit(":", 1)  # as `make setup` builds it
RUNTIMES_DIR = "/var/lib/sandlot-runtimes"  # the chart's default agent.runtimes.hostDir
LOCAL_VALUES = merged(
    VALUES,
    {
        "operator": {"leaseViewMaxAge": "15s", "livenessProbe": LIVENESS, "readinessProbe": PROBE},
        # The chart's agent.hostProc and agent.privileged (both off): sandlot cp reaches a
        # sandbox through the files tool mounted in it.
        "agent": {
            "livenessProbe": LIVENESS,
            "readinessProbe": PROBE,
            "runtimes": {
                "gvisor": {
                    "install": True,
                    "nodeSelector": dict([CONTAINERD2_LABEL]),
                    "image": {
                        "repository": RUNTIMES_REPOSITORY,
                        "tag": RUNTIMES_TAG,
                        "pullPolicy": "Never",
                    },
                }
            },
        },
    },
)


class LocalKubeletCluster(Cluster):
    local: LocalCluster
    sandbox_archive: Path

    def stop_node(self, name: str) -> None:
        self.local.node(name).stop()

    def start_node(self, name: str) -> None:
        self.local.start_node(self.local.node(name))  # images stay in its containerd

    def containers(self, node: str) -> set[str]:
        address = self.local.node(node).containerd_address
        out = subprocess.run(
            ["ctr", "--address", address, "-n", "sandlot", "containers", "ls", "-q"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return set(out.stdout.split())

    def images(self, node: str) -> set[str]:
        address = self.local.node(node).containerd_address
        out = subprocess.run(
            ["ctr", "--address", address, "-n", "sandlot", "images", "ls", "-q"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return set(out.stdout.split())

    def import_sandbox_image(self, node: str) -> None:
        import_archive(self.local.node(node).containerd_address, "sandlot", self.sandbox_archive)

    def ip_allocations(self, node: str) -> set[str]:
        networks = self.local.node(node).directory / "var/lib/cni/networks"
        return {
            f"{net.name}/{f.name}"
            for net in (networks.glob("*") if networks.is_dir() else [])
            for f in net.iterdir()
            if f.name[:1].isdigit()
        }


ALLOCATIONS: dict[str, set[str]] = {}
VALUES_FILE: list[Path] = []


@pytest.fixture(scope="module")
def image_archive() -> Path:
    return sandlot_archive(ROOT, IMAGE_NAME)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, image_archive: Path
) -> Iterator[LocalKubeletCluster]:
    work = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(
        work / "c", node_count=2, images=[image_archive], containerd2=(GVISOR_NODE,)
    )
    api = None
    try:
        runtimes = runtimes_archive(RUNTIMES_IMAGE)
        local.start(pause_archive(), PAUSE_IMAGE)
        local.import_images(local.node(GVISOR_NODE), [runtimes])
        busybox = build_image_archive(work / "busybox.tar", SANDBOX_IMAGE)
        api = load_api_client(str(local.kubeconfig))
        repository, tag = IMAGE_NAME.rsplit(":", 1)
        image = {"repository": repository, "tag": tag, "pullPolicy": "Never"}
        c = LocalKubeletCluster(local.kubeconfig, [n.name for n in local.nodes], api, image)
        c.local, c.sandbox_archive = local, busybox.path
        for name in c.workers:  # the agent runs images present in its containerd namespace
            c.import_sandbox_image(name)
        c.kubectl("label", "node", GVISOR_NODE, "=".join(CONTAINERD2_LABEL))
        ALLOCATIONS.update({n: c.ip_allocations(n) for n in c.workers})
        VALUES_FILE.append(work / "values.yaml")
        install(c, VALUES_FILE[0], LOCAL_VALUES)
        yield c
    finally:
        if api is not None:
            api.close()
        local.stop()


def _layer_names(archive: Path, index: int) -> list[str]:
    """The paths in the image's layer ``index`` (0: the bottom one)."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> bytes:
            member = outer.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
            assert member is not None
            return member.read()

        listing = outer.extractfile("index.json")
        assert listing is not None
        top = json.loads(listing.read())["manifests"][0]
        manifest = json.loads(blob(top["digest"]))
        layer = blob(manifest["layers"][index]["digest"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return tar.getnames()


def test_the_image_holds_the_source_tree_and_the_dependencies(image_archive: Path) -> None:
    """The recipe's /opt/sandlot: the package's runtime modules as in the source tree
    (the development tools left out), and every dependency pyproject.toml names,
    installed (from the runtime lock, as the Dockerfile installs them)."""
    names = _layer_names(image_archive, 1)
    assert all(n == "opt" or n.startswith(RECIPE.venv.lstrip("/")) for n in names), names[:5]
    site = next(n for n in names if n.endswith("site-packages/sandlot")).rsplit("/", 1)[0]
    shipped = {
        n[len(site) + 1 :] for n in names if n.startswith(f"{site}/sandlot/") and n.endswith(".py")
    }
    source = {
        p.relative_to(ROOT / "operator").as_posix()
        for p in (ROOT / "operator" / "sandlot").rglob("*.py")
        if "/containerd/gen/" not in p.as_posix()
    }
    runtime = {n for n in source if not n.startswith("sandlot/devtools/")}
    assert runtime != source, "no development tools in the source tree to leave out"
    assert runtime <= shipped, sorted(runtime - shipped)[:10]
    assert not any(n.startswith("sandlot/devtools/") for n in shipped), "devtools shipped"
    dists = {
        n.split("/")[-1].split("-")[0].lower().replace("_", "-")
        for n in names
        if n.endswith(".dist-info")
    }
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in wanted:
        dist = requirement.split(">")[0].split("<")[0].split("=")[0].strip().lower()
        assert dist in dists, f"{dist} not installed in {RECIPE.venv} ({sorted(dists)})"


def test_the_image_installs_exactly_the_runtime_lock(image_archive: Path) -> None:
    """Every distribution in the image's /opt/sandlot is the runtime lock's pin, at
    its version, and nothing else but the package and what ``python3 -m venv`` puts
    there (pip, and setuptools where the lock does not pin it)."""
    installed: dict[str, Version] = {}
    for n in _layer_names(image_archive, 1):
        if n.endswith(".dist-info") and "/site-packages/" in n:
            name, version = n.rsplit("/", 1)[1].removesuffix(".dist-info").split("-", 1)
            installed[canonicalize_name(name)] = Version(version)
    locked = pins(RUNTIME_LOCK)
    differ = {
        n: (str(v), str(installed.get(n))) for n, v in locked.items() if installed.get(n) != v
    }
    assert not differ, f"runtime.txt pin vs image (pinned, installed): {differ}"
    extra = set(installed) - set(locked) - {"sandlot", "pip", "setuptools"}
    assert not extra, f"installed in {RECIPE.venv} but not in the runtime lock: {sorted(extra)}"
    assert "sandlot" in installed, sorted(installed)


def _built_digests(archive: Path) -> set[str]:
    """The archive's image as a node's containerd may name it in a Pod's ``imageID``:
    its manifest's digest (with a repository) or its config's (the image ID)."""
    with tarfile.open(archive) as outer:
        listing = outer.extractfile("index.json")
        assert listing is not None
        top = json.loads(listing.read())["manifests"][0]
        member = outer.extractfile("blobs/sha256/" + top["digest"].split(":", 1)[1])
        assert member is not None
        config = json.loads(member.read())["config"]["digest"]
    return {top["digest"], config}


def test_the_chart_s_pods_run_the_image_this_run_built(
    cluster: LocalKubeletCluster, image_archive: Path
) -> None:
    """Every container the chart runs from the sandlot image runs the build of this
    source tree, not an older image left under the same name on a node."""
    built = _built_digests(image_archive)
    ran: dict[str, str] = {}
    for pod in cluster.chart_pods():
        component = (pod.metadata.labels or {}).get("app.kubernetes.io/component", "")
        ours = {c.name for c in pod.spec.containers if c.image == IMAGE_NAME}
        for status in pod.status.container_statuses or []:
            if status.name in ours:
                ran[f"{component}/{pod.metadata.name}/{status.name}"] = status.image_id
    assert {k.split("/", 1)[0] for k in ran} >= {"operator", "agent", "gateway"}, ran
    wrong = {k: v for k, v in ran.items() if v.rsplit("@", 1)[-1] not in built}
    assert not wrong, f"not the image built here ({sorted(built)}): {wrong}"


def test_a_pool_spreads_over_the_nodes(cluster: LocalKubeletCluster) -> None:
    a_pool_spreads_over_the_workers(cluster)


def test_a_tenant_with_edit_streams_through_the_gateway(
    cluster: LocalKubeletCluster, tmp_path: Path
) -> None:
    a_tenant_with_edit_streams_through_the_gateway(cluster, tmp_path)


def test_agent_sandboxs_own_client_runs_unchanged(
    cluster: LocalKubeletCluster, tmp_path: Path
) -> None:
    agent_sandboxs_client_runs_unchanged(cluster, tmp_path)


def test_a_gvisor_sandbox_runs_on_gvisor_s_kernel_on_the_node_it_was_installed_on(
    cluster: LocalKubeletCluster, tmp_path: Path
) -> None:
    a_gvisor_sandbox_runs_on_gvisor_s_kernel(cluster, GVISOR_NODE, tmp_path)
    assert_chart_pods_ready(cluster)


def test_a_stopped_nodes_sandboxes_go_dead_are_replaced_and_torn_down_once_it_is_back(
    cluster: LocalKubeletCluster,
) -> None:
    from e2e.scenarios import the_restarted_workers_agent_tears_down_the_dead_containers

    fenced = a_stopped_workers_sandboxes_go_dead_and_are_replaced(cluster)
    the_restarted_workers_agent_tears_down_the_dead_containers(cluster, fenced)


def test_cache_clear_reports_per_node(cluster: LocalKubeletCluster) -> None:
    cache_clear_reports_per_node(cluster)


def test_a_nodes_own_credentials_cannot_clear_its_taints_or_remove_its_node(
    cluster: LocalKubeletCluster,
) -> None:
    """Placement trusts a Node's taints because no node can change them: with the
    kubelet's own token (Node authorizer, NodeRestriction) a worker can read its
    Node but neither clear the taints an admin set nor delete the Node to register
    it again untainted (docs/isolation.md, placement at admission)."""
    name = cluster.workers[0]
    taint = f"e2e.sandlot.dev/trust-{os.getpid()}"
    cluster.kubectl("taint", "node", name, f"{taint}=admin:PreferNoSchedule")
    as_node = load_api_client(str(cluster.local.node(name).directory / "kubeconfig"))
    try:
        nodes = client.CoreV1Api(as_node)
        seen: Any = nodes.read_node(name)
        assert seen.metadata.name == name  # the token is the node's own
        with pytest.raises(client.ApiException) as cleared:
            nodes.patch_node(name, {"spec": {"taints": None}})
        assert cleared.value.status == 403, f"{name} could clear its taints: {cleared.value}"
        assert "not allowed to modify taints" in str(cleared.value.body), cleared.value.body
        with pytest.raises(client.ApiException) as deleted:
            nodes.delete_node(name)
        assert deleted.value.status == 403, f"{name} could delete its Node: {deleted.value}"
        now: Any = client.CoreV1Api(cluster.api).read_node(name)
        kept = now.spec.taints or []
        assert taint in {t.key for t in kept}, f"{name}'s taints now: {kept}"
    finally:
        as_node.close()
        cluster.kubectl("taint", "node", name, f"{taint}-")


def test_helm_upgrade_rolls_every_program_keeping_sandboxes(cluster: LocalKubeletCluster) -> None:
    helm_upgrade_rolls_every_program_keeping_sandboxes(cluster, VALUES_FILE[0])


def _pod(c: LocalKubeletCluster, component: str, node: str | None = None) -> Any:
    pods = [
        p for p in c.chart_pods()
        if (p.metadata.labels or {}).get("app.kubernetes.io/component") == component
        and (node is None or p.spec.node_name == node)
        and p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]  # fmt: skip
    assert pods, f"no running {component} pod" + (f" on {node}" if node else "")
    return pods[0]


def _fresh(c: LocalKubeletCluster, pod: Any) -> Any:
    return client.CoreV1Api(c.api).read_namespaced_pod(pod.metadata.name, NAMESPACE)


def _ready(pod: Any) -> bool:
    return any(x.type == "Ready" and x.status == "True" for x in pod.status.conditions or [])


def _restarts(pod: Any) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


def _program_pid(c: LocalKubeletCluster, node: str, program: str) -> int:
    """The pid (on this host) of ``sandlot <program>`` running on ``node``."""
    for pid in c.local.node(node).processes():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if program.encode() in argv and any(a.endswith(b"/sandlot") for a in argv):
                return pid
    raise AssertionError(f"no `sandlot {program}` process on {node}")


def _kubelet_restarts(c: LocalKubeletCluster, pod: Any, why: str) -> None:
    """Freeze the pod's program (a stuck process): the kubelet's liveness probe
    fails and it restarts the container; the pod is Ready again after."""
    before = _restarts(pod)
    pid = _program_pid(c, pod.spec.node_name, pod.spec.containers[0].args[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: _restarts(_fresh(c, pod)) > before,
            timeout=120,
            what=f"the kubelet restarting {pod.metadata.name} ({why})",
            interval=1,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    c.expected_restarts[pod.metadata.name] = _restarts(_fresh(c, pod))
    wait_for(lambda: _ready(_fresh(c, pod)), timeout=120, what=f"{pod.metadata.name} Ready again")
    # A frozen agent stops renewing its Lease: with the test's short lease and grace
    # its sandboxes may go Dead meanwhile; the pool replaces them.
    pool_running(c)


def test_agent_readiness_fails_while_containerd_is_down(cluster: LocalKubeletCluster) -> None:
    node = cluster.local.node(cluster.workers[-1])
    pod = _pod(cluster, "agent", node.name)
    assert _ready(pod)
    node.stop_containerd()
    try:
        wait_for(
            lambda: not _ready(_fresh(cluster, pod)),
            timeout=60,
            what=f"the kubelet marking {pod.metadata.name} not Ready (containerd down)",
            interval=1,
        )
    finally:
        node.start_containerd()
    wait_for(lambda: _ready(_fresh(cluster, pod)), timeout=90, what="the agent Ready again")
    assert _restarts(_fresh(cluster, pod)) == _restarts(pod), "readiness must not restart it"
    assert_chart_pods_ready(cluster)
    pool_running(cluster)


@contextlib.contextmanager
def _cut_off(c: LocalKubeletCluster, pod: Any) -> Iterator[None]:
    """Drop every packet from ``pod`` to the API server (no reset: a silent network
    loss, as when a node's link goes), on the pod's node, until the block ends."""
    node = c.local.node(pod.spec.node_name)
    netns = node.net.netns(node.index)
    rule = ["FORWARD", "-s", pod.status.pod_ip, "-d", node.net.api_address, "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", netns, "iptables", "-I", *rule], check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(
            ["ip", "netns", "exec", netns, "iptables", "-D", *rule], check=True, timeout=30
        )


def _leader(c: LocalKubeletCluster) -> str:
    lease = client.CoordinationV1Api(c.api).read_namespaced_lease(LEADER_LEASE, NAMESPACE)
    assert lease.spec is not None, f"Lease {LEADER_LEASE} without a spec"
    return str(lease.spec.holder_identity)


def _operator_pod(c: LocalKubeletCluster, *, leader: bool) -> Any:
    holder = _leader(c)
    return next(
        p for p in c.chart_pods()
        if (p.metadata.name == holder) == leader
        and (p.metadata.labels or {}).get("app.kubernetes.io/component") == "operator"
    )  # fmt: skip


def test_operator_readiness_fails_while_cut_off_from_the_api_server(
    cluster: LocalKubeletCluster,
) -> None:
    # The standby: what its readiness says, without a takeover (the next test cuts
    # the leader off).
    pod = _operator_pod(cluster, leader=False)
    with _cut_off(cluster, pod):
        wait_for(
            lambda: not _ready(_fresh(cluster, pod)),
            timeout=120,
            what=f"the kubelet marking {pod.metadata.name} not Ready (API server unreachable)",
            interval=1,
        )
    wait_for(lambda: _ready(_fresh(cluster, pod)), timeout=180, what="the operator Ready again")
    assert _restarts(_fresh(cluster, pod)) == _restarts(pod), "readiness must not restart it"


def _scale_pool(c: LocalKubeletCluster, replicas: int) -> None:
    c.objs.patch_namespaced_custom_object(
        GROUP, VERSION, WORKLOADS, "sandboxpools", "web", {"spec": {"replicas": replicas}}
    )


def test_a_leader_cut_off_from_the_api_server_is_replaced_and_the_pool_reconciled(
    cluster: LocalKubeletCluster,
) -> None:
    """The leader loses the network silently: the standby takes the Lease within
    the election's bounds and reconciles the pool while the old leader is still cut
    off; once the cut ends, the old leader rejoins as a standby without a restart
    and reconciliation goes on."""
    pool_running(cluster)
    pod = _operator_pod(cluster, leader=True)
    old = pod.metadata.name
    with _cut_off(cluster, pod):
        start = time.monotonic()
        wait_for(
            lambda: _leader(cluster) != old,
            timeout=TAKEOVER_S,
            what=f"the standby taking the leader Lease from {old} (cut off)",
            interval=0.5,
        )
        print(f"takeover after {time.monotonic() - start:.1f}s")
        _scale_pool(cluster, 5)
        pool_running(cluster, replicas=5)
        wait_for(
            lambda: not _ready(_fresh(cluster, pod)),
            timeout=120,
            what=f"the kubelet marking {old} not Ready (API server unreachable)",
            interval=1,
        )
    new = _leader(cluster)
    wait_for(lambda: _ready(_fresh(cluster, pod)), timeout=180, what=f"{old} Ready again")
    assert _leader(cluster) == new, "the old leader took the Lease back from a live leader"
    assert _restarts(_fresh(cluster, pod)) == _restarts(pod), "the cut must not restart it"
    _scale_pool(cluster, 4)
    pool_running(cluster)
    assert_chart_pods_ready(cluster)


def test_a_stuck_agent_is_restarted_by_its_liveness_probe(cluster: LocalKubeletCluster) -> None:
    _kubelet_restarts(cluster, _pod(cluster, "agent", cluster.workers[-1]), "agent stuck")
    assert_chart_pods_ready(cluster)


def test_a_stuck_operator_is_restarted_by_its_liveness_probe(
    cluster: LocalKubeletCluster,
) -> None:
    leader = _operator_pod(cluster, leader=True)
    assert leader.metadata.name == _leader(cluster), "the pod to freeze is not the leader"
    _kubelet_restarts(cluster, leader, "operator stuck")
    assert_chart_pods_ready(cluster)


def test_helm_uninstall_leaves_nothing_behind(cluster: LocalKubeletCluster) -> None:
    installed = cluster.local.node(GVISOR_NODE).directory / RUNTIMES_DIR.lstrip("/")
    assert (installed / "conf.d" / "gvisor.toml").is_file(), "gVisor was not installed"
    helm_uninstall_leaves_nothing(cluster, ALLOCATIONS)

    def removed() -> list[str]:  # the installer's pod, stopped, removes what it put there
        return [] if not installed.exists() else sorted(p.name for p in installed.rglob("*"))

    wait_for(
        lambda: not removed() or None,
        timeout=60,
        what=f"gVisor's files gone from {GVISOR_NODE}'s {RUNTIMES_DIR}",
        interval=1,
    )
