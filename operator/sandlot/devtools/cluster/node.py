"""One node of the local cluster: its own containerd (CRI on; the OS package, or
2.x built from its module when the node is given its binaries) and kubelet, in
the node's network namespace and in a mount namespace of their own.

The kubelet and containerd write to fixed host paths (``/var/lib/kubelet``,
``/var/log/pods``, ``/run/containerd``) and the chart mounts the standard node
paths. The node's processes therefore see ``/run``, ``/var/lib`` and ``/var/log``
bound from the node's directory, and the whole tree shared (so a pod's
Bidirectional mount propagates, as on a node): the host's own paths stay
untouched, and two nodes never meet. From the host, the node's containerd is at
``<node dir>/run/containerd/containerd.sock``.

Stopping a node kills every process of its network namespace and their
descendants (containerd, kubelet, shims, pods and sandboxes), as powering a
machine off does; starting it again empties its ``/run`` first, as a boot does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from sandlot.devtools.cluster.network import ClusterNet

BIND_DIRS = ("run", "var/lib", "var/log")
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
CNI_CONF_DIR = "/var/lib/sandlot-node/cni"  # inside the node: its own /var/lib
CGROUP_MOUNTS = Path("/sys/fs/cgroup")

LAUNCHER = """\
set -eu
node="$1"
for d in {binds}; do
  mkdir -p "$node/$d"
  mount --bind "$node/$d" "/$d"
done
mount --make-rshared /
mkdir -p /run/containerd /var/lib/kubelet /var/log/pods /var/log/containers
{path}containerd --config "$node/containerd.toml" >>"$node/containerd.log" 2>&1 &
tries=0
until [ -S /run/containerd/containerd.sock ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 300 ]; then echo "containerd did not start; see $node/containerd.log" >&2; exit 1; fi
  sleep 0.1
done
exec "$2" --config="$node/kubelet.yaml" --kubeconfig="$node/kubeconfig" \\
  --hostname-override="$3" --node-ip="$4" --cert-dir="$node/pki" --v=0 \\
  >>"$node/kubelet.log" 2>&1
"""


@dataclass
class Node:
    name: str
    index: int
    directory: Path
    net: ClusterNet
    pause_image: str
    kubelet: Path
    process: subprocess.Popen[bytes] | None = None
    containerd_bin: Path | None = None
    """The directory of containerd 2.x's binaries (its daemon and runc shim, found
    first on the node's PATH); None: the OS package's, on PATH."""

    @property
    def address(self) -> str:
        return self.net.node_address(self.index)

    @property
    def containerd_address(self) -> str:
        """containerd's socket as seen from the host."""
        return str(self.directory / "run" / "containerd" / "containerd.sock")

    @property
    def cgroup_root(self) -> str:
        return f"/sandlot-{self.net.tag}-{self.index}"

    def write_config(self, api_url: str, ca_file: Path, token: str) -> None:
        d = self.directory
        for sub in (*BIND_DIRS, "pki", CNI_CONF_DIR.lstrip("/")):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "containerd.toml").write_text(self._containerd_config())
        (d / CNI_CONF_DIR.lstrip("/") / "10-pods.conflist").write_text(
            json.dumps(self._cni_config(), indent=2)
        )
        (d / "kubelet.yaml").write_text(yaml.safe_dump(self._kubelet_config()))
        (d / "kubeconfig").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {"server": api_url, "certificate-authority": str(ca_file)},
                        }
                    ],
                    "users": [{"name": self.name, "user": {"token": token}}],
                    "contexts": [
                        {"name": "local", "context": {"cluster": "local", "user": self.name}}
                    ],
                    "current-context": "local",
                }
            )
        )
        path = f'export PATH="{self.containerd_bin}:$PATH"\n' if self.containerd_bin else ""
        (d / "launch.sh").write_text(LAUNCHER.format(binds=" ".join(BIND_DIRS), path=path))

    def _containerd_config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return "\n".join(
            [
                "version = 2",
                'root = "/var/lib/containerd"',
                'state = "/run/containerd"',
                "[grpc]",
                '  address = "/run/containerd/containerd.sock"',
                f"[{cri}]",
                f'  sandbox_image = "{self.pause_image}"',
                # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE.
                "  restrict_oom_score_adj = true",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
                f"[{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri}.cni]",
                f'  bin_dir = "{CNI_BIN_DIR}"',
                f'  conf_dir = "{CNI_CONF_DIR}"',
                "",
            ]
        )

    def _cni_config(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": "sandlot-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.net.pod_cidr(self.index)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        }

    def _kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host runs cgroup v1 and may have swap.
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "address": self.address,
            "healthzBindAddress": "127.0.0.1",
            "readOnlyPort": 0,
            # The kubelet listens on the node's address, reached from the host only.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": "",
            "maxPods": 30,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            # Images are imported, never pulled: nothing may collect them, and a
            # loaded machine's disk must not evict the cluster's pods.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
        }  # fmt: skip

    def make_cgroups(self) -> None:
        """The kubelet's cgroup root in every hierarchy (cgroup v1: one per controller);
        cpuset's needs its CPUs and memory nodes before any task joins."""
        if not CGROUP_MOUNTS.is_dir():
            return
        for controller in sorted(CGROUP_MOUNTS.iterdir()):
            if not controller.is_dir() or controller.is_symlink():
                continue
            top = controller / self.cgroup_root.lstrip("/")
            if (controller / "cgroup.procs").exists():
                top.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (controller / knob).exists() and not (top / knob).read_text().strip():
                    (top / knob).write_text((controller / knob).read_text())

    def start(self) -> int:
        """Boot the node: empty ``/run``, then containerd and the kubelet in its namespaces."""
        self.make_cgroups()
        run_dir = self.directory / "run"
        if run_dir.exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        argv = [
            "nsenter", f"--net=/run/netns/{self.net.netns(self.index)}",
            "unshare", "--mount", "--propagation", "private",
            "sh", str(self.directory / "launch.sh"),
            str(self.directory), str(self.kubelet), self.name, self.address,
        ]  # fmt: skip
        log = (self.directory / "launch.log").open("ab")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.process = proc
        return proc.pid

    def processes(self) -> list[int]:
        """Every process in the node's network namespace, and their descendants."""
        try:
            inode = self.net.netns_inode(self.index)
        except FileNotFoundError:
            return []
        roots, parents = [], {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            with contextlib.suppress(OSError, IndexError, ValueError):
                if os.stat(f"/proc/{pid}/ns/net").st_ino == inode:
                    roots.append(pid)
                stat = Path(f"/proc/{pid}/stat").read_text()
                parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        found, frontier = set(roots), list(roots)
        while frontier:
            parent = frontier.pop()
            for pid, ppid in parents.items():
                if ppid == parent and pid not in found:
                    found.add(pid)
                    frontier.append(pid)
        return sorted(found)

    def stop(self, timeout: float = 30.0) -> None:
        """Kill the node's processes (a power-off), within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            pids = [p for p in self.processes() if p != os.getpid()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name}: processes {pids} outlived SIGKILL")
            time.sleep(0.1)
        if self.process is not None:  # reap the launcher (the kubelet) if it is ours
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            self.process = None

    def remove_cgroups(self, timeout: float = 15.0) -> None:
        """Remove the kubelet's cgroup trees. A cgroup is busy until its killed tasks
        are reaped (by init, once their shim is gone): retried until ``timeout``."""
        if not CGROUP_MOUNTS.is_dir():
            return
        deadline = time.monotonic() + timeout
        while True:
            left = [
                c / self.cgroup_root.lstrip("/")
                for c in CGROUP_MOUNTS.iterdir()
                if (c / self.cgroup_root.lstrip("/")).is_dir()
            ]
            if not left or time.monotonic() > deadline:
                return
            for top in left:
                for dirpath, _dirs, _files in sorted(
                    os.walk(top), key=lambda w: w[0].count("/"), reverse=True
                ):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)
            time.sleep(0.2)

    def containerd_pids(self) -> list[int]:
        return [p for p in self.processes() if _argv0(p) == "containerd"]

    def stop_containerd(self) -> None:
        """Kill the node's containerd alone (its shims and containers keep running)."""
        for pid in self.containerd_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def start_containerd(self) -> subprocess.Popen[bytes]:
        """Start containerd again inside the node's namespaces (the kubelet's)."""
        kubelet = next(p for p in self.processes() if _argv0(p) == "kubelet")
        log = (self.directory / "containerd.log").open("ab")
        env = dict(os.environ)
        if self.containerd_bin is not None:
            env["PATH"] = f"{self.containerd_bin}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.net.netns(self.index)}",
             f"--mount=/proc/{kubelet}/ns/mnt", "containerd",
             "--config", str(self.directory / "containerd.toml")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip
        log.close()
        return proc


def _argv0(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return os.path.basename(raw.split(b"\0", 1)[0].decode(errors="replace"))
