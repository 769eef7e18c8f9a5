"""Which network namespace a tcpSocket or httpGet probe enters, from plain data:
the named one a container's spec joins, else the task's, but only a process whose
``/proc/<pid>/cgroup`` puts it in the container's cgroup counts as the task."""

from __future__ import annotations

import pytest

from sandlot.policy.ocispec import cgroups_path_for, in_cgroup, network_namespace_path


def _spec(*namespaces: dict[str, str]) -> dict[str, object]:
    return {"linux": {"namespaces": [{"type": "pid"}, *namespaces, {"type": "mount"}]}}


def test_the_named_namespace_the_spec_joins_is_entered_by_its_path() -> None:
    joined = _spec({"type": "network", "path": "/run/netns/sandlot-abc"})
    assert network_namespace_path(joined) == "/run/netns/sandlot-abc"


@pytest.mark.parametrize(
    "spec",
    [_spec({"type": "network"}), _spec({"type": "network", "path": ""}), _spec(), {}],
    ids=["runc-makes-one", "empty-path", "node-network", "no-linux-section"],
)
def test_no_named_namespace_leaves_the_task_to_find(spec: dict[str, object]) -> None:
    assert network_namespace_path(spec) is None


CONTAINER = cgroups_path_for("sb-1")


@pytest.mark.parametrize(
    "proc_cgroup",
    [
        "0::/sandlot/sb-1\n",  # cgroup v2, the reader in the root cgroup namespace
        "0::/../../sandlot/sb-1\n",  # the reader in a cgroup namespace of its own
        "12:memory:/sandlot/sb-1\n11:pids:/sandlot/sb-1\n1:name=systemd:/x\n",  # v1
        "0::/kubepods/pod-a/sandlot/sb-1/\n",
    ],
)
def test_a_process_in_the_containers_cgroup_is_the_task(proc_cgroup: str) -> None:
    assert in_cgroup(proc_cgroup, CONTAINER)


@pytest.mark.parametrize(
    "proc_cgroup",
    [
        "0::/system.slice/containerd.service\n",  # what the agent's own pid may name
        "0::/sandlot/sb-10\n",  # another sandbox whose name starts the same
        "0::/sandlot/sb-1/inner\n",  # a child cgroup is not the container's own
        "0::/othersandlot/sb-1\n",  # the same end, not on a whole segment
        "",
    ],
)
def test_any_other_process_is_not_the_task(proc_cgroup: str) -> None:
    assert not in_cgroup(proc_cgroup, CONTAINER)


def test_an_empty_cgroups_path_matches_nothing() -> None:
    assert not in_cgroup("0::/\n", "")
    assert not in_cgroup("0::/\n", "/")
