"""sandlot on kind (a control plane and two workers): the image built from the
Dockerfile and loaded into the nodes, the chart installed by helm, and the
scenarios of e2e/scenarios.py run in order on one cluster (one xdist group), a
worker stopped and started with ``docker stop``/``docker start``; plus one that
needs the pod network and cluster DNS of kind (a pool's Service reached from a pod
on another node).

Where Docker or kind is missing the module is skipped with one line saying why
and how to run it. The same scenarios run on the local kubelet cluster in
e2e/test_local_cluster.py (part of ``make test``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.wait import wait_for

from e2e.scenarios import (
    ROOT,
    SANDBOX_IMAGE,
    VALUES,
    WORKLOADS,
    Cluster,
    a_pool_spreads_over_the_workers,
    a_stopped_workers_sandboxes_go_dead_and_are_replaced,
    cache_clear_reports_per_node,
    helm_uninstall_leaves_nothing,
    helm_upgrade_rolls_every_program_keeping_sandboxes,
    install,
    merged,
    phase,
    run,
    the_restarted_workers_agent_tears_down_the_dead_containers,
)
from sandlot.adapters.kube import load_api_client
from sandlot.devtools.ociarchive import build_image_archive

HOW = "run `make e2e` on a machine with Docker and kind"
# Why a machine without Docker skips: kind's podman provider runs here from a node
# image assembled without Docker, but this suite has no podman path yet
# (docs/development.md, "kind without Docker: the podman provider").
NO_PODMAN_PATH = (
    "kind's podman provider runs three nodes, kindnet and CoreDNS here from a node image"
    " assembled by hand (docs/development.md#kind-without-docker-the-podman-provider),"
    " but this suite drives only `docker` and the project does not build that image yet"
)


def _unavailable() -> str | None:
    if shutil.which("docker") is None:
        return f"kind e2e skipped: no `docker` command; {NO_PODMAN_PATH}; {HOW}"
    try:
        engine = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        engine = None
    if engine is None or engine.returncode != 0:
        return f"kind e2e skipped: no Docker engine (docker info failed); {NO_PODMAN_PATH}; {HOW}"
    if shutil.which("kind") is None:
        return (
            f"kind e2e skipped: `kind` is not on PATH (go install sigs.k8s.io/kind@v0.33.0); {HOW}"
        )
    return None


REASON = _unavailable()
if REASON is not None:
    pytest.skip(REASON, allow_module_level=True)

pytestmark = [pytest.mark.kind, pytest.mark.xdist_group("kind")]

IMAGE = "sandlot:e2e"
# Sandboxes join the pod network (kindnet) through the node's CNI plugins; kindnet's
# host-local keeps its allocations in a dataDir of its own.
IPAM_STATE_DIRS = ["/var/lib/cni", "/run/cni-ipam-state"]
KIND_VALUES = merged(
    VALUES,
    {"agent": {"privileged": True, "cni": {"mount": True, "stateDirs": IPAM_STATE_DIRS}}},
)


class KindCluster(Cluster):
    def stop_node(self, name: str) -> None:
        run("docker", "stop", name)

    def start_node(self, name: str) -> None:
        run("docker", "start", name)

    def containers(self, node: str) -> set[str]:
        return set(
            run("docker", "exec", node, "ctr", "-n", "sandlot", "containers", "ls", "-q").split()
        )

    def images(self, node: str) -> set[str]:
        return set(
            run("docker", "exec", node, "ctr", "-n", "sandlot", "images", "ls", "-q").split()
        )

    def import_sandbox_image(self, node: str) -> None:
        run("docker", "cp", str(SANDBOX_ARCHIVE[0]), f"{node}:/tmp/sandbox-image.tar")
        run(
            "docker",
            "exec",
            node,
            "ctr",
            "-n",
            "sandlot",
            "images",
            "import",
            "/tmp/sandbox-image.tar",
        )

    def ip_allocations(self, node: str) -> set[str]:
        out = run(
            "docker", "exec", node, "sh", "-c",
            "ls /var/lib/cni/networks/*/ /run/cni-ipam-state/*/ 2>/dev/null || true",
        )  # fmt: skip
        return {f for f in out.split() if f[:1].isdigit()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    work = tmp_path_factory.mktemp("kind")
    name = f"sandlot-e2e-{uuid.uuid4().hex[:6]}"
    kubeconfig = work / "kubeconfig"
    run(
        "kind", "create", "cluster", "--name", name, "--config", str(ROOT / "e2e" / "kind-config.yaml"),
        "--kubeconfig", str(kubeconfig), "--wait", "180s",
    )  # fmt: skip
    api = None
    try:
        run("docker", "build", "-t", IMAGE, str(ROOT), timeout=1800)
        run("kind", "load", "docker-image", IMAGE, "--name", name)
        nodes = run("kind", "get", "nodes", "--name", name).split()
        workers = sorted(n for n in nodes if "control-plane" not in n)
        SANDBOX_ARCHIVE.append(work / "busybox.tar")
        build_image_archive(SANDBOX_ARCHIVE[0], SANDBOX_IMAGE)
        api = load_api_client(str(kubeconfig))
        image = {"repository": "sandlot", "tag": "e2e", "pullPolicy": "Never"}
        c = KindCluster(kubeconfig, workers, api, image)
        for node in workers:  # the agent runs images present in its containerd namespace
            c.import_sandbox_image(node)
        ALLOCATIONS.update({n: c.ip_allocations(n) for n in workers})
        install(c, work / "values.yaml", KIND_VALUES)
        VALUES_FILE.append(work / "values.yaml")
        yield c
    finally:
        if api is not None:
            api.close()
        run("kind", "delete", "cluster", "--name", name, check=False)


ALLOCATIONS: dict[str, set[str]] = {}
VALUES_FILE: list[Path] = []
SANDBOX_ARCHIVE: list[Path] = []
# What the stop scenario left for the restart scenario (they run in order).


def test_a_pool_spreads_over_the_workers(cluster: KindCluster) -> None:
    a_pool_spreads_over_the_workers(cluster)


def test_the_pools_service_reaches_a_sandbox_from_a_pod_on_another_node(
    cluster: KindCluster,
) -> None:
    """Sandboxes have pod-network addresses (CNI): a Pod on one worker reaches, through
    the pool's Service (no selector; sandlot writes its EndpointSlice), a member
    running on the other worker."""
    member = next(sb for sb in cluster.sandboxes() if phase(sb) == "Running")
    other = next(w for w in cluster.workers if w != member["spec"]["nodeName"])
    probe = (
        "import urllib.request,sys;"
        f"sys.stdout.write(urllib.request.urlopen('http://web.{WORKLOADS}.svc:8080/', timeout=5)"
        ".read().decode())"
    )
    cluster.kubectl(
        "-n", WORKLOADS, "run", "probe", f"--image={IMAGE}", "--image-pull-policy=Never",
        "--restart=Never", f"--overrides={json.dumps({'spec': {'nodeName': other}})}",
        "--command", "--", "python", "-c", probe,
    )  # fmt: skip

    def answered() -> bool:
        status = cluster.kubectl(
            "-n", WORKLOADS, "get", "pod", "probe", "-o", "jsonpath={.status.phase}", check=False
        )
        return status in ("Succeeded", "Failed")

    wait_for(answered, timeout=120, what="the probe Pod to finish", interval=2)
    logs = cluster.kubectl("-n", WORKLOADS, "logs", "probe")
    cluster.kubectl("-n", WORKLOADS, "delete", "pod", "probe", "--wait=false")
    assert "hello-from-sandlot" in logs, logs


def test_a_stopped_workers_sandboxes_go_dead_are_replaced_and_torn_down_once_it_is_back(
    cluster: KindCluster,
) -> None:
    fenced = a_stopped_workers_sandboxes_go_dead_and_are_replaced(cluster)
    the_restarted_workers_agent_tears_down_the_dead_containers(cluster, fenced)


def test_cache_clear_reports_per_node(cluster: KindCluster) -> None:
    cache_clear_reports_per_node(cluster)


def test_helm_upgrade_rolls_every_program_keeping_sandboxes(cluster: KindCluster) -> None:
    helm_upgrade_rolls_every_program_keeping_sandboxes(cluster, VALUES_FILE[0])


def test_helm_uninstall_leaves_no_sandlot_object(cluster: KindCluster) -> None:
    helm_uninstall_leaves_nothing(cluster, ALLOCATIONS)
