"""sandlot on a real cluster: kind (a control plane and two workers), the image
built from the Dockerfile and loaded into the nodes, the chart installed by helm.

The scenarios run in order on one cluster (one xdist group):

1. a pool spreads over both workers;
2. ``docker stop`` of one worker: after the (shortened) grace its sandboxes are
   Dead and replaced on the other worker;
3. ``docker start`` of it: its agent, on boot, tears the Dead sandboxes'
   containers down instead of re-adopting them;
4. ``sandlot cache clear containerd --all`` reports per node;
5. ``helm uninstall``, with the pool still running, leaves no sandlot object
   behind and no container on the workers: its pre-delete hook (``sandlot purge
   --workloads``) has the agents stop every sandbox before the DaemonSet goes, its
   post-delete hook (``sandlot purge --nodes``) removes the SandboxNodes whose
   finalizer nobody is left to release; the CRDs stay, as helm keeps a chart's crds/.

Where Docker or kind is missing the module is skipped with one line saying why
and how to run it. The same scenarios run on the local control plane with local
agents in tests/integration (test_nodehealth, test_agent_node, test_chart).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.support.wait import wait_for

from sandlot.adapters.kube import load_api_client
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import POOL_LABEL
from sandlot.devtools.controlplane import helm_path, kubectl_path
from sandlot.devtools.ociarchive import build_image_archive

HOW = "run `make e2e` on a machine with Docker and kind"


def _unavailable() -> str | None:
    if shutil.which("docker") is None:
        return f"kind e2e skipped: no `docker` command; {HOW}"
    try:
        engine = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        engine = None
    if engine is None or engine.returncode != 0:
        return f"kind e2e skipped: no Docker engine (docker info failed); {HOW}"
    if shutil.which("kind") is None:
        return (
            f"kind e2e skipped: `kind` is not on PATH (go install sigs.k8s.io/kind@v0.33.0); {HOW}"
        )
    return None


REASON = _unavailable()
if REASON is not None:
    pytest.skip(REASON, allow_module_level=True)

pytestmark = [pytest.mark.kind, pytest.mark.xdist_group("kind")]

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "sandlot:e2e"
SANDBOX_IMAGE = "docker.io/sandlot/e2e-busybox:1"
RELEASE, NAMESPACE, WORKLOADS = "sandlot", "sandlot-system", "e2e"
GRACE_S, LEASE_S = 20, 10
HTTPD = (
    "mkdir -p /www && echo hello-from-sandlot > /www/index.html && exec httpd -f -p 8080 -h /www"
)

VALUES: dict[str, Any] = {
    "image": {"repository": "sandlot", "tag": "e2e", "pullPolicy": "Never"},
    "operator": {"gracePeriod": f"{GRACE_S}s", "resyncInterval": "5s"},
    "agent": {
        "leaseDuration": f"{LEASE_S}s",
        "renewInterval": "2s",
        "reapInterval": "5s",
        "killWait": "5s",
        # Sandboxes join the pod network (kindnet) through the node's CNI plugins.
        "privileged": True,
        "cni": {"mount": True},
        # Sandboxes go on the workers only; the control plane stays out of the pool.
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "node-role.kubernetes.io/control-plane",
                                    "operator": "DoesNotExist",
                                }
                            ]
                        }
                    ]
                }
            }
        },
    },
}


def run(*argv: str, timeout: float = 600, check: bool = True, **kw: Any) -> str:
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


@dataclass
class Cluster:
    name: str
    kubeconfig: Path
    workers: list[str]
    api: client.ApiClient

    def kubectl(self, *args: str, check: bool = True) -> str:
        return run(str(kubectl_path()), "--kubeconfig", str(self.kubeconfig), *args, check=check)

    def helm(self, *args: str) -> str:
        return run(str(helm_path()), "--kubeconfig", str(self.kubeconfig), *args)

    def sandlot(self, *args: str, check: bool = True) -> str:
        return run(
            sys.executable,
            "-m",
            "sandlot.cli.main",
            *args,
            "--kubeconfig",
            str(self.kubeconfig),
            check=check,
        )

    @property
    def objs(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def sandboxes(self) -> list[dict[str, Any]]:
        out = self.objs.list_namespaced_custom_object(
            GROUP, VERSION, WORKLOADS, "sandboxes", label_selector=f"{POOL_LABEL}=web"
        )
        return list(out["items"])

    def containers(self, node: str) -> set[str]:
        return set(
            run("docker", "exec", node, "ctr", "-n", "sandlot", "containers", "ls", "-q").split()
        )


def _phase(sb: dict[str, Any]) -> str | None:
    return (sb.get("status") or {}).get("phase")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
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
        archive = work / "busybox.tar"
        build_image_archive(archive, SANDBOX_IMAGE)
        for node in workers:  # the agent runs images present in its containerd namespace
            run("docker", "cp", str(archive), f"{node}:/tmp/sandbox-image.tar")
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
        values = work / "values.yaml"
        values.write_text(yaml.safe_dump(VALUES))
        api = load_api_client(str(kubeconfig))
        c = Cluster(name, kubeconfig, workers, api)
        c.helm(
            "install", RELEASE, str(ROOT / "charts" / "sandlot"), "--namespace", NAMESPACE,
            "--create-namespace", "-f", str(values), "--wait", "--timeout", "5m",
        )  # fmt: skip
        c.kubectl("create", "namespace", WORKLOADS)
        yield c
    finally:
        if api is not None:
            api.close()
        run("kind", "delete", "cluster", "--name", name, check=False)


def ready_nodes(c: Cluster) -> set[str]:
    items = c.objs.list_cluster_custom_object(GROUP, VERSION, "sandboxnodes")["items"]
    return {n["metadata"]["name"] for n in items if _phase(n) == "Ready"}


def test_a_pool_spreads_over_the_workers(cluster: Cluster) -> None:
    wait_for(
        lambda: ready_nodes(cluster) == set(cluster.workers),
        timeout=180,
        what=f"both workers' SandboxNodes Ready ({cluster.workers})",
        interval=2,
    )
    cluster.objs.create_namespaced_custom_object(
        GROUP, VERSION, WORKLOADS, "sandboxpools",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxPool",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 4,
                "serviceName": "web",
                "template": {"spec": {
                    "image": SANDBOX_IMAGE,
                    "command": ["sh", "-c", HTTPD],
                    "ports": [{"name": "http", "containerPort": 8080}],
                }},
            },
        },
    )  # fmt: skip

    def spread() -> bool:
        running = [sb for sb in cluster.sandboxes() if _phase(sb) == "Running"]
        return len(running) == 4 and {sb["spec"]["nodeName"] for sb in running} == set(
            cluster.workers
        )

    wait_for(spread, timeout=180, what="4 Running members on both workers", interval=2)


def test_the_pools_service_reaches_a_sandbox_from_a_pod_on_another_node(cluster: Cluster) -> None:
    """Sandboxes have pod-network addresses (CNI): a Pod on one worker reaches, through
    the pool's Service (no selector; sandlot writes its EndpointSlice), a member
    running on the other worker."""
    member = next(sb for sb in cluster.sandboxes() if _phase(sb) == "Running")
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
        phase = cluster.kubectl(
            "-n", WORKLOADS, "get", "pod", "probe", "-o", "jsonpath={.status.phase}", check=False
        )
        return phase in ("Succeeded", "Failed")

    wait_for(answered, timeout=120, what="the probe Pod to finish", interval=2)
    logs = cluster.kubectl("-n", WORKLOADS, "logs", "probe")
    cluster.kubectl("-n", WORKLOADS, "delete", "pod", "probe", "--wait=false")
    assert "hello-from-sandlot" in logs, logs


def test_a_stopped_workers_sandboxes_go_dead_and_are_replaced(cluster: Cluster) -> None:
    lost = cluster.workers[0]
    on_lost = {
        sb["metadata"]["name"]: sb["status"]["containerId"]
        for sb in cluster.sandboxes()
        if sb["spec"].get("nodeName") == lost and _phase(sb) == "Running"
    }
    assert on_lost, f"no Running member on {lost}"
    run("docker", "stop", lost)
    try:

        def dead_and_replaced() -> bool:
            by_name = {sb["metadata"]["name"]: sb for sb in cluster.sandboxes()}
            dead = all(_phase(by_name[n]) == "Dead" for n in on_lost if n in by_name)
            running = [sb for sb in by_name.values() if _phase(sb) == "Running"]
            elsewhere = all(sb["spec"]["nodeName"] != lost for sb in running)
            return dead and len(running) == 4 and elsewhere

        wait_for(
            dead_and_replaced,
            timeout=LEASE_S + GRACE_S + 120,
            what=f"{lost}'s members Dead and 4 Running on the other worker",
            interval=2,
        )
        for name in on_lost:
            sb = cluster.objs.get_namespaced_custom_object(
                GROUP, VERSION, WORKLOADS, "sandboxes", name
            )
            assert sb["status"]["reason"] == "NodeLost"
    finally:
        run("docker", "start", lost)
    FENCED.update(node=lost, containers=set(on_lost.values()))


# What the stop scenario left for the restart scenario (they run in order).
FENCED: dict[str, Any] = {"node": "", "containers": set()}


def test_the_restarted_workers_agent_tears_down_the_dead_containers(cluster: Cluster) -> None:
    node, containers = FENCED["node"], FENCED["containers"]
    assert node, "the previous scenario did not run"
    wait_for(
        lambda: node in ready_nodes(cluster),
        timeout=300,
        what=f"{node} Ready again after docker start",
        interval=2,
    )
    wait_for(
        lambda: not (containers & cluster.containers(node)),
        timeout=120,
        what=f"the Dead members' containers gone from {node}",
        interval=2,
    )


def test_cache_clear_reports_per_node(cluster: Cluster) -> None:
    out = cluster.sandlot("cache", "clear", "containerd", "--all", "--timeout", "3m")
    for node in cluster.workers:
        assert node in out, out


def test_helm_uninstall_leaves_no_sandlot_object(cluster: Cluster) -> None:
    manifest = cluster.helm("get", "manifest", RELEASE, "--namespace", NAMESPACE)
    hooks = cluster.helm("get", "hooks", RELEASE, "--namespace", NAMESPACE)
    released = [d for d in yaml.safe_load_all(manifest + "\n---\n" + hooks) if d]
    assert any(cluster.containers(node) for node in cluster.workers), "no sandbox left to purge"
    # Nothing deleted by hand: the hooks do it all.
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m")

    for node in cluster.workers:
        left = cluster.containers(node)
        assert not left, f"containers left running on {node} after uninstall: {left}"
    for doc in released:  # the hooks' Jobs and RBAC too (hook-succeeded)
        kind, name = doc["kind"], doc["metadata"]["name"]
        ns = doc["metadata"].get("namespace")
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        if ns:
            args += ["-n", ns]
        assert not cluster.kubectl(*args).strip(), f"{kind} {name} left behind"
    left = cluster.kubectl(
        "get", "sandboxes,sandboxpools,sandboxnodes,cacheprunes", "-A", "-o", "name"
    )
    assert not left.strip(), f"sandlot objects left behind:\n{left}"
    leases = cluster.kubectl(
        "get", "leases", "-n", NAMESPACE, "-l", "sandlot.dev/agent-lease=true", "-o", "name"
    )
    assert not leases.strip(), f"node Leases left behind:\n{leases}"
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=180s")
