"""The chart's part in keeping tenants inside their sandboxes: the agent is
``system-node-critical`` (the kubelet never evicts it before the sandboxes it
guards) and the limits, capacity and cgroup parent reach the agent."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from sandlot.devtools.controlplane import helm_path
from tests.support.kube import repo_root

CHART = repo_root() / "charts" / "sandlot"


def _agent(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(helm_path()), "template", "sl", str(CHART), "--namespace", "sandlot-system", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return dict(daemonset)


def _env(daemonset: dict[str, Any]) -> dict[str, str]:
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_agent_runs_system_node_critical_by_default() -> None:
    assert _agent()["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"


def test_limits_capacity_and_cgroup_parent_reach_the_agent() -> None:
    env = _env(
        _agent(
            "--set",
            "agent.defaultLimits.memory=256Mi,agent.defaultLimits.cpu=500m,"
            "agent.capacityMemory=64Gi,agent.capacityCpu=16,agent.cgroupParent=/sandboxes.slice",
        )
    )
    assert env["SANDLOT_DEFAULT_MEMORY_LIMIT"] == "256Mi"
    assert env["SANDLOT_DEFAULT_CPU_LIMIT"] == "500m"
    assert env["SANDLOT_CAPACITY_MEMORY"] == "64Gi"
    assert env["SANDLOT_CAPACITY_CPU"] == "16"
    assert env["SANDLOT_CGROUP_PARENT"] == "/sandboxes.slice"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("agent.cgroupParent=relative", "cgroupParent"),
        ("agent.capacityMemory=lots", "capacityMemory"),
    ],
    ids=["relative cgroup parent", "capacity not a quantity"],
)
def test_bad_values_are_refused(value: str, words: str) -> None:
    proc = subprocess.run(
        [str(helm_path()), "template", "sl", str(CHART), "--set", value],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0 and words in proc.stderr, proc.stderr
