"""``sandlot status`` against the real API server: nodes with their GC state,
sandboxes counted by node and phase from the Sandboxes themselves, pools."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import rfc3339
from sandlot.devtools.controlplane import ControlPlane
from tests.support.operator import Fleet

pytestmark = pytest.mark.integration


def row(output: str, first: str) -> list[str]:
    for line in output.splitlines():
        cells = line.split()
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


def test_status_summarizes_nodes_sandboxes_and_pools(
    fleet: Fleet, kube: client.ApiClient, control_plane: ControlPlane, namespace: str
) -> None:
    objs: Any = client.CustomObjectsApi(kube)
    now = datetime.now(UTC)
    n1, n2 = fleet.node("n1"), fleet.node("n2", unschedulable=True)
    objs.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sandboxnodes",
        n1,
        {
            "status": {
                "phase": "Ready",
                "capacity": {"sandboxes": 7},
                "gc": {
                    "lastPassTime": rfc3339(now - timedelta(minutes=5)),
                    "lastPassKind": "forced",
                    "bytesFreed": 3 * 1024**3,
                    "exhaustedUntil": rfc3339(now + timedelta(minutes=20)),
                },
            }
        },
    )
    objs.patch_cluster_custom_object_status(
        GROUP, VERSION, "sandboxnodes", n2, {"status": {"phase": "Disabled"}}
    )
    fleet.sandbox("a", n1, "Running")
    fleet.sandbox("b", n1, "Running")
    fleet.sandbox("c", n1, "Dead")
    fleet.sandbox("d", n2, "Scheduled")
    objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxpools",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxPool",
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "template": {"spec": {"image": "example.test/x:1"}}},
        },
    )
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxpools", "web", {"status": {"running": 2}}
    )

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandlot.cli.main",
            "status",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--namespace",
            namespace,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("NODES (2: 1 Disabled, 1 Ready)"), out
    header = row(out, "NAME")
    assert header == [
        "NAME",
        "PHASE",
        "SANDBOXES",
        "CAPACITY",
        "LAST-GC",
        "FREED",
        "EXHAUSTED-UNTIL",
    ]
    # Dead sandboxes do not count against a node; GC state comes from its status.
    assert row(out, n1)[:8] == [n1, "Ready", "2", "7", "forced", "5m", "ago", "3.0GiB"]
    assert "(in 19m)" in out or "(in 20m)" in out
    assert row(out, n2) == [n2, "Disabled", "1", "-", "-", "-", "-"]

    phases = row(out, "NODE")
    assert phases == ["NODE", "PENDING", "SCHEDULED", "RUNNING", "STOPPED", "FAILED", "DEAD"]
    assert row(out, n1)[0] == n1
    by_phase = [line.split() for line in out.split("SANDBOXES BY NODE")[1].splitlines()]
    assert [n1, "0", "0", "2", "0", "0", "1"] in by_phase
    assert [n2, "0", "1", "0", "0", "0", "0"] in by_phase

    assert row(out, namespace) == [namespace, "web", "3", "2", "0", "0"]
