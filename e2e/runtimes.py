"""The runtime-class scenario of a cluster where the chart installed gVisor on one
node (e2e/test_local_cluster.py: worker2, the node running containerd 2.x): that
node alone publishes the handler gvisor and the chart's RuntimeClass selects it; a
Sandbox of the class is placed there, Running, and is gVisor inside (its kernel
version and its kernel log are gVisor's, in its log and through an exec); exec,
logs and a file copied in and back out work through the gateway as under runc."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.support.wait import wait_for

from e2e.scenarios import SANDBOX_IMAGE, WORKLOADS, Cluster, phase, run
from sandlot.api.common import GROUP, VERSION

GVISOR = "gvisor"
READY_LINE = "__gvisor_ready__"


def handlers(c: Cluster, node: str) -> list[str]:
    body = c.objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)
    return [h["name"] for h in (body.get("status") or {}).get("runtimeHandlers") or []]


def _as_admin(c: Cluster, command: str, *args: str) -> str:
    """``sandlot <command>`` with the kubeconfig before any ``--``."""
    return run(
        sys.executable, "-m", "sandlot.cli.main", command, "--kubeconfig", str(c.kubeconfig), *args
    )


def a_gvisor_sandbox_runs_on_gvisor_s_kernel(c: Cluster, node: str, work: Path) -> None:
    others = [w for w in c.workers if w != node]
    wait_for(
        lambda: GVISOR in handlers(c, node),
        timeout=90,
        what=f"{node}'s SandboxNode offering the runtime handler {GVISOR} (installed by the chart)",
        interval=1,
    )
    for other in others:  # not installed there: not offered
        assert GVISOR not in handlers(c, other), (other, handlers(c, other))
    # The chart's class carries the installer's node selector: matched against the
    # Kubernetes Nodes' labels (which no agent writes), it confirms the handler the
    # node publishes and places the class's sandboxes on those Nodes only.
    rc = client.NodeV1Api(c.api).read_runtime_class(GVISOR)
    assert rc.handler == GVISOR and rc.scheduling is not None, rc
    assert rc.scheduling.node_selector, rc

    name = f"gv-{uuid.uuid4().hex[:6]}"
    command = f"busybox uname -r; busybox dmesg; echo {READY_LINE}; exec sleep 3600"
    c.objs.create_namespaced_custom_object(
        GROUP, VERSION, WORKLOADS, "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {
                "image": SANDBOX_IMAGE,
                "command": ["sh", "-c", command],
                "runtimeClassName": GVISOR,
            },
        },
    )  # fmt: skip

    def running() -> dict[str, Any] | None:
        sb = c.objs.get_namespaced_custom_object(GROUP, VERSION, WORKLOADS, "sandboxes", name)
        assert phase(sb) not in {"Failed", "Succeeded", "Dead"}, sb.get("status")
        return sb if phase(sb) == "Running" else None

    sb = wait_for(running, timeout=120, what=f"gVisor sandbox {name} Running", interval=1)
    assert sb["spec"]["nodeName"] == node, f"placed on {sb['spec']['nodeName']}, not {node}"

    def logged() -> str | None:
        out = _as_admin(c, "logs", name, "-n", WORKLOADS)
        return out if READY_LINE in out else None

    log = wait_for(logged, timeout=60, what=f"{name}'s log up to {READY_LINE}", interval=1)
    kernel = log.splitlines()[0].strip()
    assert kernel.endswith("gvisor") and kernel != os.uname().release, log
    assert "Starting gVisor..." in log, log  # gVisor's kernel log, not the node's
    exec_kernel = _as_admin(c, "exec", name, "-n", WORKLOADS, "--", "busybox", "uname", "-r")
    assert exec_kernel.strip() == kernel, exec_kernel

    local = work / "to-gvisor.txt"
    local.write_text("written under gVisor\n")
    _as_admin(c, "cp", str(local), f"{name}:/tmp/in.txt", "-n", WORKLOADS)
    seen = _as_admin(c, "exec", name, "-n", WORKLOADS, "--", "cat", "/tmp/in.txt")
    assert seen == "written under gVisor\n", seen
    back = work / "from-gvisor.txt"
    _as_admin(c, "cp", f"{name}:/tmp/in.txt", str(back), "-n", WORKLOADS)
    assert back.read_text() == "written under gVisor\n"

    c.objs.delete_namespaced_custom_object(GROUP, VERSION, WORKLOADS, "sandboxes", name)

    def gone() -> bool:
        names = {
            s["metadata"]["name"]
            for s in c.objs.list_namespaced_custom_object(GROUP, VERSION, WORKLOADS, "sandboxes")[
                "items"
            ]
        }
        return name not in names

    wait_for(gone, timeout=90, what=f"gVisor sandbox {name} deleted and torn down", interval=1)
