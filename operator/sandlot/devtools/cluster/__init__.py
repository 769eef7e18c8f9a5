"""A local Kubernetes cluster on one machine (``sandlot dev cluster up|down``, and
the cluster tests): the control plane of ``sandlot.devtools.controlplane`` with
all of kube-controller-manager, kube-scheduler, and nodes each running their own
containerd and kubelet (``node.py``) in network and mount namespaces of their own
(``network.py``). Every binary is built from its Go module and cached by version;
every image a node runs is built here and imported (``images.py``): nothing is
pulled.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sandlot.devtools.cluster.network import ClusterNet
from sandlot.devtools.cluster.node import Node
from sandlot.devtools.controlplane import (
    ETCD_VERSION,
    KUBE_VERSION,
    ControlPlane,
    _run_build,
    stop_detached,
)
from sandlot.devtools.ociarchive import import_archive

NODE_BUILD_SCRIPT = Path(__file__).parents[1] / "controlplane" / "build-node.sh"
CONTAINERD2_BUILD_SCRIPT = Path(__file__).parents[1] / "controlplane" / "build-containerd.sh"
API_PORT = 443  # the port of the `kubernetes` Service, which pods dial
IMAGE_NAMESPACE = "k8s.io"  # the kubelet's containerd namespace


def containerd2_dir(build_timeout: float = 3000.0) -> Path:
    """containerd 2.x's binaries, built once from its module (build-containerd.sh)."""
    return _run_build(CONTAINERD2_BUILD_SCRIPT, "containerd 2.x", build_timeout)


def node_binaries_dir(build_timeout: float = 3000.0) -> Path:
    """kubelet and kube-scheduler, built once from the API server's module and release."""
    return _run_build(
        NODE_BUILD_SCRIPT,
        "kubelet and kube-scheduler",
        build_timeout,
        KUBE_VERSION=KUBE_VERSION,
        ETCD_VERSION=ETCD_VERSION,
    )


@dataclass
class LocalCluster:
    workdir: Path
    node_count: int = 2
    images: list[Path] = field(default_factory=list)  # archives imported into every node
    ready_timeout: float = 180.0
    containerd2: tuple[str, ...] = ()
    """Nodes (by name) running containerd 2.x (built and cached) instead of the OS's."""
    net: ClusterNet | None = None
    plane: ControlPlane | None = None
    nodes: list[Node] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.kubeconfig

    def start(self, pause_archive: Path, pause_image: str, *, detach: bool = False) -> None:
        """Network, control plane, scheduler, nodes; returns when every node is Ready."""
        self.workdir = self.workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        bins = node_binaries_dir()
        self.net = ClusterNet.choose(uuid.uuid4().hex[:5])
        self._save_state()  # so `down` can clean up whatever exists, even a failed start
        try:
            self._start(bins, pause_archive, pause_image, detach)
        except BaseException:
            self.stop()
            raise

    def _start(self, bins: Path, pause_archive: Path, pause_image: str, detach: bool) -> None:
        net = self.net
        assert net is not None
        net.create_bridge()
        names = [f"worker{i + 1}" for i in range(self.node_count)]
        for i in range(self.node_count):
            net.create_node(i, self.node_count)
        plane_dir = self.workdir / "plane"
        plane_dir.mkdir(exist_ok=True)
        admin, tokens = os.urandom(24).hex(), {n: os.urandom(24).hex() for n in names}
        lines = [f'{admin},sandlot-admin,sandlot-admin,"system:masters"']
        lines += [f'{t},system:node:{n},{n},"system:nodes"' for n, t in tokens.items()]
        (plane_dir / "tokens.csv").write_text("\n".join(lines) + "\n")
        certs = plane_dir / "certs"
        self.plane = ControlPlane(
            workdir=plane_dir,
            controller_manager=True,
            address=net.api_address,
            apiserver_port=API_PORT,
            authorization_mode="Node,RBAC",
            disabled_admission_plugins="",
            kcm_controllers="*",
            extra_kcm_flags=[
                f"--root-ca-file={certs / 'apiserver.crt'}",
                f"--service-account-private-key-file={certs / 'sa.key'}",
            ],
            extra_apiserver_flags=[
                f"--service-cluster-ip-range={net.service_cidr}",
                "--enable-admission-plugins=NodeRestriction",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
            ],
        )
        self.plane.start(detach=detach)
        self.plane._spawn(
            "kube-scheduler",
            [str(bins / "kube-scheduler"), f"--kubeconfig={self.plane.kubeconfig}",
             "--leader-elect=false", "--secure-port=0", "--v=0"],
            detach,
        )  # fmt: skip
        for i, name in enumerate(names):
            node = Node(name, i, self.workdir / name, net, pause_image, bins / "kubelet")
            if name in self.containerd2:
                node.containerd_bin = containerd2_dir()
            node.write_config(self.plane.url, self.plane.ca_file, tokens[name])
            self.nodes.append(node)
        self._save_state()
        for node in self.nodes:
            self.start_node(node)
        self._save_state()
        # Imports (hundreds of MB) run on all nodes at once.
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            for done in [
                pool.submit(self.import_images, node, [pause_archive, *self.images])
                for node in self.nodes
            ]:
                done.result()
        self.wait_nodes_ready()

    def import_images(self, node: Node, archives: list[Path]) -> None:
        for archive in archives:
            import_archive(node.containerd_address, IMAGE_NAMESPACE, archive, timeout=600)

    def start_node(self, node: Node) -> None:
        """Boot ``node`` (again); returns once its containerd's socket is there."""
        node.start()
        deadline = time.monotonic() + 60
        while not Path(node.containerd_address).exists():
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(
                    f"node {node.name} exited while booting; see {node.directory}/launch.log "
                    f"and {node.directory}/containerd.log"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node.name}: containerd did not start within 60s")
            time.sleep(0.1)

    def wait_nodes_ready(self, names: list[str] | None = None) -> None:
        from kubernetes import client

        from sandlot.adapters.kube import load_api_client

        want = set(names or [n.name for n in self.nodes])
        api = load_api_client(str(self.kubeconfig))
        deadline = time.monotonic() + self.ready_timeout
        ready: set[str] = set()
        try:
            while time.monotonic() < deadline:
                ready = {
                    str(n.metadata.name)  # type: ignore[union-attr]
                    for n in client.CoreV1Api(api).list_node().items
                    if any(
                        c.type == "Ready" and c.status == "True"
                        for c in n.status.conditions or []  # type: ignore[union-attr]
                    )
                }
                if want <= ready:
                    return
                for node in self.nodes:
                    if node.process is not None and node.process.poll() is not None:
                        raise RuntimeError(
                            f"node {node.name}'s kubelet exited ({node.process.returncode}); "
                            f"see {node.directory}/kubelet.log"
                        )
                time.sleep(0.5)
        finally:
            api.close()
        raise RuntimeError(
            f"nodes {sorted(want - ready)} not Ready within {self.ready_timeout:.0f}s; "
            f"see {self.workdir}/<node>/kubelet.log"
        )

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        """Stop everything and remove the network, namespaces and cgroups it made."""
        for node in self.nodes:
            node.stop()
            node.remove_cgroups()
        if self.plane is not None:
            scheduler = self.plane._procs.pop("kube-scheduler", None)
            if scheduler is not None:
                scheduler.terminate()
                scheduler.wait(timeout=15)
            self.plane.stop()
        stop_detached(self.workdir / "plane")
        if self.net is not None:
            self.net.remove(max(self.node_count, len(self.nodes)))
        (self.workdir / "cluster.json").unlink(missing_ok=True)

    def _save_state(self) -> None:
        state: dict[str, object] = {
            "tag": self.net.tag if self.net else "",
            "c": self.net.c if self.net else 0,
            "node_count": self.node_count,
            "nodes": [n.name for n in self.nodes],
        }
        if self.plane is not None:
            (self.workdir / "plane" / "state.json").write_text(json.dumps(self.plane.state()))
        (self.workdir / "cluster.json").write_text(json.dumps(state))

    @classmethod
    def from_state(cls, workdir: Path) -> LocalCluster | None:
        """The cluster ``start(detach=True)`` left under ``workdir``, to stop it."""
        path = workdir.resolve() / "cluster.json"
        if not path.exists():
            return None
        state = json.loads(path.read_text())
        net = ClusterNet(state["tag"], state["c"]) if state["tag"] else None
        cluster = cls(workdir.resolve(), node_count=state["node_count"], net=net)
        if net is not None:
            cluster.nodes = [
                Node(name, i, workdir.resolve() / name, net, "", Path("kubelet"))
                for i, name in enumerate(state["nodes"])
            ]
        return cluster


def remove_workdir(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
