"""The demo's sandbox network: a CNI bridge + host-local configuration under the
demo's directory, run by the OS's CNI plugins (``containernetworking-plugins``),
so sandboxes get their own addresses as on a cluster. Without the plugins the
agents fall back to the node's address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandlot.adapters.cni import Attachment, SandboxNetwork
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

    def release(self, containerd_address: str, nodes: Iterable[str]) -> None:
        """Tear down what the agents left running, with CNI DEL and netns removal (the
        agents keep sandboxes on exit), then remove the demo bridge."""
        if not self.bin_dirs:
            return
        network = SandboxNetwork(str(self.conf_dir), self.bin_dirs, timeout=10)

        def release(container: Any) -> None:
            found = Attachment.from_labels(container.id, container.labels)
            if found is not None:
                network.detach(found)

        for node in nodes:
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
        subprocess.run(["ip", "link", "del", CNI_BRIDGE], capture_output=True, check=False)
