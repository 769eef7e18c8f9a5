"""The e2e scenarios, written once for any real cluster: kind (e2e/test_kind.py,
where Docker is) or the local kubelet cluster (e2e/test_local_cluster.py). A test
module provides a ``Cluster`` (how to stop and start a node, and list the
containers on it) and runs the scenarios in order on one cluster:

1. ``helm install`` with the chart's defaults plus test values: the operator and
   agent pods Ready through their probes;
2. a pool spreads over the workers;
3. a stopped worker's sandboxes are Dead after the (shortened) grace and replaced
   on the other worker;
4. the worker started again: its agent, on boot, tears the Dead sandboxes'
   containers down instead of re-adopting them;
5. ``sandlot cache clear containerd --all`` reports per node;
6. ``helm upgrade`` with a changed value rolls every program (operator, agent, gateway), and every
Running
   sandbox keeps running (same container);
   Between 2 and 3, agent-sandbox's own client (unmodified) creates a sandbox from a
   warm pool through the chart's agent-sandbox face, runs a command and moves files
   through the router on a tenant's credentials, and terminates it.
7. ``helm uninstall``, with the pool still running, leaves no sandlot object, no
   container on the workers, no Lease and no IP allocation behind: its pre-delete
   hook (``sandlot purge --workloads``) has the agents stop every sandbox before the
   DaemonSet goes, its post-delete hook (``sandlot purge --nodes``) removes the
   SandboxNodes whose finalizer nobody is left to release; the CRDs stay.

After each scenario no chart pod restarted unless the scenario restarted it (the
stopped worker's agent).
"""

from __future__ import annotations

import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from tests.support.wait import wait_for

from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import POOL_LABEL
from sandlot.devtools.controlplane import helm_path, kubectl_path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "sandlot"
SANDBOX_IMAGE = "docker.io/sandlot/e2e-busybox:1"
RELEASE, NAMESPACE, WORKLOADS = "sandlot", "sandlot-system", "e2e"
# Shortened from the defaults (300 s, 60 s): a lost node's sandboxes go Dead after 70 s.
# The grace still has to cover an agent's restart (its old pod stopped, the new one
# renewing), which ``helm upgrade`` must survive: measured at up to 31 s on a loaded
# 2-core machine, most of it the new process's start.
GRACE_S, LEASE_S = 60, 10
HTTPD = (
    "mkdir -p /www && echo hello-from-sandlot > /www/index.html && exec httpd -f -p 8080 -h /www"
)

# The chart's defaults plus what every e2e cluster needs: short grace and leases,
# images present on the nodes, sandboxes on the workers only.
VALUES: dict[str, Any] = {
    "agentSandbox": {"enabled": True},
    "operator": {"gracePeriod": f"{GRACE_S}s", "resyncInterval": "5s"},
    "agent": {
        "leaseDuration": f"{LEASE_S}s",
        "renewInterval": "2s",
        "reapInterval": "5s",
        "killWait": "5s",
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


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merged(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def run(*argv: str, timeout: float = 600, check: bool = True, **kw: Any) -> str:
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return str(proc.stdout)  # text=True: a str


@dataclass
class Cluster(ABC):
    kubeconfig: Path
    workers: list[str]
    api: client.ApiClient
    image: dict[str, str]  # the chart's image values (repository, tag, pullPolicy)
    # Restarts a scenario caused on purpose, per pod name: not counted as unexpected.
    expected_restarts: dict[str, int] = field(default_factory=dict)

    @abstractmethod
    def stop_node(self, name: str) -> None: ...

    @abstractmethod
    def start_node(self, name: str) -> None: ...

    @abstractmethod
    def containers(self, node: str) -> set[str]:
        """IDs of the containers in the agents' containerd namespace on ``node``."""

    @abstractmethod
    def images(self, node: str) -> set[str]:
        """Names of the images in the agents' containerd namespace on ``node``."""

    @abstractmethod
    def import_sandbox_image(self, node: str) -> None:
        """Put the sandboxes' image into the agents' containerd namespace on ``node``."""

    @abstractmethod
    def ip_allocations(self, node: str) -> set[str]:
        """Addresses the node's CNI IPAM holds."""

    def kubectl(self, *args: str, check: bool = True) -> str:
        return run(str(kubectl_path()), "--kubeconfig", str(self.kubeconfig), *args, check=check)

    def helm(self, *args: str) -> str:
        return run(str(helm_path()), "--kubeconfig", str(self.kubeconfig), *args)

    def sandlot(self, *args: str, check: bool = True) -> str:
        return run(
            sys.executable, "-m", "sandlot.cli.main", *args, "--kubeconfig", str(self.kubeconfig),
            check=check,
        )  # fmt: skip

    @property
    def objs(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def sandboxes(self) -> list[dict[str, Any]]:
        out = self.objs.list_namespaced_custom_object(
            GROUP, VERSION, WORKLOADS, "sandboxes", label_selector=f"{POOL_LABEL}=web"
        )
        return list(out["items"])

    def chart_pods(self) -> list[Any]:
        return list(client.CoreV1Api(self.api).list_namespaced_pod(NAMESPACE).items)


def phase(obj: dict[str, Any]) -> str | None:
    return (obj.get("status") or {}).get("phase")


def install(c: Cluster, values_file: Path, values: dict[str, Any]) -> None:
    values_file.write_text(yaml.safe_dump(merged(values, {"image": c.image})))
    c.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "-f", str(values_file), "--wait", "--timeout", "5m",
    )  # fmt: skip
    c.kubectl("create", "namespace", WORKLOADS)
    assert_chart_pods_ready(c)


def _running_pods(c: Cluster) -> list[Any]:
    return [
        p
        for p in c.chart_pods()
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]


def assert_chart_pods_ready(c: Cluster, timeout: float = 120) -> None:
    """Every chart pod Ready (probes passing), and none restarted unexpectedly."""

    def all_ready() -> bool:
        pods = _running_pods(c)
        kinds = {(p.metadata.labels or {}).get("app.kubernetes.io/component") for p in pods}
        ready = all(all(s.ready for s in p.status.container_statuses or []) for p in pods)
        return ready and {"operator", "agent"} <= kinds

    wait_for(all_ready, timeout=timeout, what="the operator and agent pods Ready", interval=1)
    for pod in _running_pods(c):
        allowed = c.expected_restarts.get(pod.metadata.name, 0)
        for status in pod.status.container_statuses or []:
            assert status.restart_count <= allowed, (
                f"pod {pod.metadata.name} container {status.name} restarted "
                f"{status.restart_count} time(s) (last state: {status.last_state})"
            )


def ready_nodes(c: Cluster) -> set[str]:
    items = c.objs.list_cluster_custom_object(GROUP, VERSION, "sandboxnodes")["items"]
    return {n["metadata"]["name"] for n in items if phase(n) == "Ready"}


def a_pool_spreads_over_the_workers(c: Cluster) -> None:
    wait_for(
        lambda: ready_nodes(c) == set(c.workers),
        timeout=180,
        what=f"every worker's SandboxNode Ready ({c.workers})",
        interval=2,
    )
    c.objs.create_namespaced_custom_object(
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
        running = [sb for sb in c.sandboxes() if phase(sb) == "Running"]
        return len(running) == 4 and {sb["spec"]["nodeName"] for sb in running} == set(c.workers)

    wait_for(spread, timeout=180, what="4 Running members on every worker", interval=2)
    assert_chart_pods_ready(c)


def a_tenant_with_edit_streams_through_the_gateway(c: Cluster, work: Path) -> None:
    """A ServiceAccount bound to Kubernetes' own ``edit`` role in the workloads'
    namespace (sandlot's roles aggregate into it) reads a member's log, execs in it and
    copies a file in and out, through the API server and the chart's gateway; the
    same in another namespace is refused."""
    core: Any = client.CoreV1Api(c.api)  # bodies as plain JSON
    core.create_namespaced_service_account(WORKLOADS, {"metadata": {"name": "tenant"}})
    rbac: Any = client.RbacAuthorizationV1Api(c.api)
    rbac.create_namespaced_role_binding(
        WORKLOADS,
        {
            "metadata": {"name": "tenant-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": WORKLOADS}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "tenant", WORKLOADS, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = yaml.safe_load(c.kubeconfig.read_text())
    admin["users"] = [{"name": "tenant", "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = "tenant"
    tenant = work / "tenant.kubeconfig"
    tenant.write_text(yaml.safe_dump(admin))

    def as_tenant(command: str, *args: str) -> str:  # the kubeconfig before any `--`
        return run(
            sys.executable, "-m", "sandlot.cli.main", command, "--kubeconfig", str(tenant), *args
        )

    member = next(sb for sb in c.sandboxes() if phase(sb) == "Running")["metadata"]["name"]

    def reads_log() -> bool:
        logs = subprocess.run(
            [sys.executable, "-m", "sandlot.cli.main", "logs", member, "-n", WORKLOADS,
             "--kubeconfig", str(tenant)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return logs.returncode == 0

    wait_for(
        reads_log,
        timeout=60,
        what=f"the tenant to read {member}'s log (the edit role's aggregation included)",
        interval=2,
    )
    assert as_tenant("exec", member, "-n", WORKLOADS, "--", "cat", "/www/index.html").strip()
    local = work / "upload.txt"
    local.write_text("through the gateway\n")
    as_tenant("cp", str(local), f"{member}:/tmp/upload.txt", "-n", WORKLOADS)
    back = work / "download.txt"
    as_tenant("cp", f"{member}:/tmp/upload.txt", str(back), "-n", WORKLOADS)
    assert back.read_text() == "through the gateway\n"
    refused = subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", "exec", member, "-n", "default",
         "--kubeconfig", str(tenant), "--", "true"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr


@dataclass(frozen=True)
class Fenced:
    """A worker that was stopped until its members went Dead, and their containers."""

    node: str
    containers: frozenset[str]


def a_stopped_workers_sandboxes_go_dead_and_are_replaced(c: Cluster) -> Fenced:
    """Returns what its second half checks: the stopped node and its containers."""
    lost = c.workers[0]
    on_lost = {
        sb["metadata"]["name"]: sb["status"]["containerId"]
        for sb in c.sandboxes()
        if sb["spec"].get("nodeName") == lost and phase(sb) == "Running"
    }
    assert on_lost, f"no Running member on {lost}"
    listed = c.containers(lost)
    assert set(on_lost.values()) <= listed, f"{lost} lists {listed}, not {on_lost}"
    c.stop_node(lost)
    try:

        def dead_and_replaced() -> bool:
            by_name = {sb["metadata"]["name"]: sb for sb in c.sandboxes()}
            dead = all(phase(by_name[n]) == "Dead" for n in on_lost if n in by_name)
            running = [sb for sb in by_name.values() if phase(sb) == "Running"]
            elsewhere = all(sb["spec"]["nodeName"] != lost for sb in running)
            return dead and len(running) == 4 and elsewhere

        wait_for(
            dead_and_replaced,
            timeout=LEASE_S + GRACE_S + 120,
            what=f"{lost}'s members Dead and 4 Running on the other worker(s)",
            interval=2,
        )
        for name in on_lost:
            sb = c.objs.get_namespaced_custom_object(GROUP, VERSION, WORKLOADS, "sandboxes", name)
            assert sb["status"]["reason"] == "NodeLost"
    finally:
        c.start_node(lost)
    return Fenced(lost, frozenset(on_lost.values()))


def the_restarted_workers_agent_tears_down_the_dead_containers(c: Cluster, fenced: Fenced) -> None:
    """The second half of the stopped-node scenario, in the same test: the node that
    was stopped is back, and its agent removed the Dead members' containers."""
    node, containers = fenced.node, fenced.containers
    wait_for(
        lambda: node in ready_nodes(c),
        timeout=300,
        what=f"{node} Ready again after it was started",
        interval=2,
    )
    wait_for(
        lambda: not (containers & c.containers(node)),
        timeout=120,
        what=f"the Dead members' containers gone from {node}",
        interval=2,
    )
    # The stopped node's agent restarted with it: that restart is expected.
    for pod in c.chart_pods():
        if pod.spec.node_name == node:
            c.expected_restarts[pod.metadata.name] = max(
                (s.restart_count for s in pod.status.container_statuses or []), default=0
            )
    assert_chart_pods_ready(c, timeout=180)


def cache_clear_reports_per_node(c: Cluster) -> None:
    """The forced prune removes the sandbox image where no sandbox runs it, keeps it
    where one does, and its table says so per node: what was removed and freed, and
    what was held back as in use."""
    running = {sb["spec"].get("nodeName") for sb in c.sandboxes() if phase(sb) == "Running"}
    for node in c.workers:
        assert SANDBOX_IMAGE in c.images(node), f"{node} lacks {SANDBOX_IMAGE} before the clear"
    out = c.sandlot("cache", "clear", "containerd", "--all", "--timeout", "3m")
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    idle = [node for node in c.workers if node not in running]
    assert idle, f"every worker runs a member ({running}): nothing to prune anywhere"
    for node in c.workers:
        assert node in rows, f"no row for {node}:\n{out}"
        cells = rows[node].split("   ")
        cells = [cell.strip() for cell in cells if cell.strip()]
        removed, freed, held, error = int(cells[2]), cells[3], cells[4], cells[5]
        assert error == "-", f"{node}: {rows[node]}"
        present = SANDBOX_IMAGE in c.images(node)
        if node in running:
            assert present, f"{node} runs a member, yet the clear removed its image:\n{out}"
            assert not held.startswith("0 B/"), f"{node} held nothing back as in use:\n{out}"
        else:
            assert not present, f"{node} runs nothing, yet kept {SANDBOX_IMAGE}:\n{out}"
            assert removed >= 1 and freed != "0 B", f"{node} reports nothing freed:\n{out}"
    # Nothing is pulled here: put the image back where the prune took it.
    for node in idle:
        c.import_sandbox_image(node)


def helm_upgrade_rolls_every_program_keeping_sandboxes(c: Cluster, values_file: Path) -> None:
    before = {
        sb["metadata"]["name"]: sb["status"]["containerId"]
        for sb in c.sandboxes()
        if phase(sb) == "Running"
    }
    assert before, "no Running sandbox to keep"
    # The programs' pods; a runtime installer's (nothing of it changed) stays put.
    old_pods = {p.metadata.uid for p in c.chart_pods() if _component(p) in PROGRAMS}
    c.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values_file),
        "--set-string", "operator.podAnnotations.sandlot-e2e/revision=2",
        "--set-string", "agent.podAnnotations.sandlot-e2e/revision=2",
        "--set-string", "gateway.podAnnotations.sandlot-e2e/revision=2",
        "--wait", "--timeout", "5m",
    )  # fmt: skip

    def rolled() -> bool:
        pods = _running_pods(c)
        ready = all(all(s.ready for s in p.status.container_statuses or []) for p in pods)
        return ready and bool(pods) and not ({p.metadata.uid for p in c.chart_pods()} & old_pods)

    wait_for(
        rolled,
        timeout=300,
        what="every operator, agent and gateway pod replaced and Ready",
        interval=2,
    )
    c.expected_restarts.clear()
    after = {sb["metadata"]["name"]: sb for sb in c.sandboxes()}
    for name, container in before.items():
        assert name in after, f"sandbox {name} gone after the upgrade"
        assert phase(after[name]) == "Running", f"{name}: {after[name].get('status')}"
        assert after[name]["status"]["containerId"] == container, f"{name} was restarted"
    assert_chart_pods_ready(c)


PROGRAMS = ("operator", "agent", "gateway")


def _component(pod: Any) -> str:
    return str((pod.metadata.labels or {}).get("app.kubernetes.io/component"))


def pool_running(c: Cluster, timeout: float = 180, replicas: int = 4) -> None:
    """Wait until the pool has its members Running again (after a disruption)."""

    def running() -> bool:
        members = c.sandboxes()
        seen = sorted(
            (sb["metadata"]["name"], sb["spec"].get("nodeName"), phase(sb)) for sb in members
        )
        assert len([sb for sb in members if phase(sb) == "Running"]) == replicas, seen
        return True

    wait_for(
        running,
        timeout=timeout,
        what=f"the pool's {replicas} members Running",
        interval=2,
    )


def helm_uninstall_leaves_nothing(c: Cluster, allocations_before: dict[str, set[str]]) -> None:
    pool_running(c)
    manifest = c.helm("get", "manifest", RELEASE, "--namespace", NAMESPACE)
    hooks = c.helm("get", "hooks", RELEASE, "--namespace", NAMESPACE)
    released = [d for d in yaml.safe_load_all(manifest + "\n---\n" + hooks) if d]
    assert any(c.containers(node) for node in c.workers), "no sandbox left to purge: " + str(
        [
            (sb["metadata"]["name"], sb["spec"].get("nodeName"), sb.get("status"))
            for sb in c.sandboxes()
        ]
    )
    # Nothing deleted by hand: the hooks do it all.
    c.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m")

    for node in c.workers:
        left = c.containers(node)
        assert not left, f"containers left running on {node} after uninstall: {left}"
    for doc in released:  # the hooks' Jobs and RBAC too (hook-succeeded)
        kind, name = doc["kind"], doc["metadata"]["name"]
        ns = doc["metadata"].get("namespace")
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        if ns:
            args += ["-n", ns]
        annotations = doc["metadata"].get("annotations") or {}
        if annotations.get("helm.sh/resource-policy") == "keep":
            # Kept on purpose (agent-sandbox's CRDs, as sandlot's own): their users' objects.
            assert c.kubectl(*args).strip(), f"{kind} {name} was not kept"
            continue
        assert not c.kubectl(*args).strip(), f"{kind} {name} left behind"
    # By group: agent-sandbox's kept Sandbox shares the plural, and kubectl resolves
    # the bare name to its group.
    objects = c.kubectl(
        "get",
        "sandboxes.sandlot.dev,sandboxpools.sandlot.dev,sandboxnodes.sandlot.dev,"
        "cacheprunes.sandlot.dev",
        "-A",
        "-o",
        "name",
    )
    assert not objects.strip(), f"sandlot objects left behind:\n{objects}"
    leases = c.kubectl(
        "get", "leases", "-n", NAMESPACE, "-l", "sandlot.dev/agent-lease=true", "-o", "name"
    )
    assert not leases.strip(), f"node Leases left behind:\n{leases}"
    c.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=180s")

    def released_addresses() -> bool:
        return all(c.ip_allocations(n) <= allocations_before.get(n, set()) for n in c.workers)

    wait_for(
        released_addresses, timeout=60, what="IP allocations back to before the install", interval=1
    )
