"""The demo's sandbox network: a CNI bridge + host-local configuration under the
demo's directory, run by the OS's CNI plugins (``containernetworking-plugins``),
so sandboxes get their own addresses as on a cluster. Without the plugins the
agents fall back to the node's address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sandlot.adapters.cni import DEFAULT_IFNAME, Attachment, CniError, Netns, SandboxNetwork
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.agent.teardown import teardown_many

CNI_BRIDGE = "sldemo0"
CNI_SUBNET = "10.88.0.0/24"
CNI_PLUGIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni")


class DemoNetwork:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    @property
    def conf_dir(self) -> Path:
        return self.workdir / "cni" / "net.d"

    @property
    def bin_dirs(self) -> str:
        return ":".join(d for d in CNI_PLUGIN_DIRS if os.path.exists(os.path.join(d, "bridge")))

    def agent_flags(self) -> list[str]:
        """CNI flags for an agent, writing the demo's bridge network the first time."""
        if not self.bin_dirs:
            return ["--network-mode", "host-address"]
        conflist = self.conf_dir / "10-sandlot-demo.conflist"
        if not conflist.exists():
            self.conf_dir.mkdir(parents=True, exist_ok=True)
            plugin = {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": CNI_SUBNET}]],
                    "dataDir": str(self.workdir / "cni" / "ipam"),
                },
            }
            body = {"cniVersion": "1.0.0", "name": "sandlot-demo", "plugins": [plugin]}
            conflist.write_text(json.dumps(body, indent=2))
        return [
            "--network-mode",
            "cni",
            "--cni-conf-dir",
            str(self.conf_dir),
            "--cni-bin-dir",
            self.bin_dirs,
        ]

    @property
    def ipam_dir(self) -> Path:
        return self.workdir / "cni" / "ipam"

    def recorded_attachments(self) -> list[Attachment]:
        """The attachments the host-local plugin still holds an address for: one file
        per address under its data directory (``<network>/<ip>``, holding
        ``<container id>\\r\\n<ifname>``). They outlive containerd, so what a crash
        left is still found; the namespace is the one the agent names after the
        container."""
        found: dict[tuple[str, str], Attachment] = {}
        for record in sorted(self.ipam_dir.glob("*/*")):
            if record.name == "lock" or record.name.startswith("last_reserved_ip."):
                continue
            try:
                container_id, _, ifname = record.read_bytes().decode().partition("\r\n")
            except OSError:
                continue
            container_id, ifname = container_id.strip(), ifname.strip() or DEFAULT_IFNAME
            if container_id:
                netns = Netns.path_of(Netns.name_for(container_id))
                attachment = Attachment(container_id, record.parent.name, netns, ifname)
                found[(container_id, ifname)] = attachment
        return list(found.values())

    def release(self, containerd_address: str | None, nodes: Iterable[str]) -> int:
        """Tear down every sandbox network of the demo's agents (they keep sandboxes
        on exit); how many were released. Through containerd when it runs (the
        container's task is killed first, its labels say what DEL needs), then from
        the addresses the IPAM plugin still records (all that is left once
        containerd is gone). Each is a CNI DEL and the namespace's removal."""
        if not self.bin_dirs or not self.conf_dir.is_dir():  # the agents never used CNI
            return 0
        network = SandboxNetwork(str(self.conf_dir), self.bin_dirs, timeout=10)
        released: set[str] = set()

        def release(container: Any) -> None:
            found = Attachment.from_labels(container.id, container.labels)
            if found is not None:
                network.detach(found)
                released.add(found.netns_name)

        if containerd_address is not None:
            for node in nodes:
                self._tear_down_containers(containerd_address, node, release)
        for attachment in self.recorded_attachments():
            try:
                network.detach(attachment)
                released.add(attachment.netns_name)
            except CniError as exc:
                print(f"cannot release {attachment.container_id}: {exc}", file=sys.stderr)
        return len(released)

    @staticmethod
    def _tear_down_containers(
        containerd_address: str, node: str, release: Callable[[Any], None]
    ) -> None:
        runtime = ContainerdRuntime(containerd_address, f"sandlot-{node}")
        try:
            teardown_many(
                runtime,
                runtime.list_containers(timeout=10),
                kill_wait=3,
                call_timeout=5,
                concurrency=8,
                release=release,
            )
        except Exception as exc:
            print(f"cannot release the networks of {node}: {exc}", file=sys.stderr)
        finally:
            runtime.close()

    def remove_bridge(self) -> bool:
        """Delete the demo bridge unless a port is still on it; whether it was deleted."""
        ports = subprocess.run(
            ["ip", "-o", "link", "show", "master", CNI_BRIDGE],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if ports.returncode != 0 or ports.stdout.strip():  # no bridge, or not empty
            return False
        deleted = subprocess.run(
            ["ip", "link", "del", CNI_BRIDGE], capture_output=True, timeout=30, check=False
        )
        return deleted.returncode == 0
