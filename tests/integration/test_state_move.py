"""Suspended state pushed to a real registry and started again on another node.

The cluster of tests/support/pools.py (a real operator process, real agents on
their own containerd namespaces) with every agent's ``suspend_state_repository``
on the loopback registry behind htpasswd (its credential in a .dockerconfigjson
file, as the chart mounts it). A sandbox's file, rewritten after it started, is
there when it runs again on another node: moved by the scheduler once its node
is cordoned, or by ``sandlot nodes drain --move``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import Credential, Endpoint, RegistryClient, RegistryError
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.registry import LOOPBACK_HOSTS
from tests.support.operator import Fleet
from tests.support.pools import IMAGE, Cluster, LocalNode, Start, node_of, start_operator
from tests.support.registry import AUTH_PASSWORD, AUTH_USER, LOOPBACK_ACCESS, Registry
from tests.support.wait import wait_for

pytest_plugins = ["tests.support.registry"]
pytestmark = [pytest.mark.containerd, pytest.mark.integration]

# Writes /kept once (a fresh start would write it again), then keeps running.
WRITER = [
    "sh",
    "-c",
    "[ -f /kept ] || echo written-fresh > /kept; trap 'exit 0' TERM; "
    "while true; do sleep 0.2; done",
]


@pytest.fixture
def moving(cluster: Cluster, auth_registry: Registry, tmp_path: Path) -> Cluster:
    """``cluster`` whose agents push suspended state to the registry."""
    auth = base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()
    secret = tmp_path / "state-secret.json"
    secret.write_text(json.dumps({"auths": {auth_registry.host: {"auth": auth}}}))
    cluster.agent_overrides = {
        "suspend_state_repository": f"{auth_registry.host}/sandlot/state",
        "suspend_state_auth_file": str(secret),
        "registry_private_hosts": sorted(LOOPBACK_HOSTS),
    }
    # The operator brokers the state keys and deletes (with the same credential here:
    # the test registry's htpasswd grants one user everything).
    cluster.operator_flags = (
        "--state-repository",
        f"{auth_registry.host}/sandlot/state",
        "--state-auth-file",
        str(secret),
        *(f"--state-registry-private-hosts={h}" for h in sorted(LOOPBACK_HOSTS)),
    )
    return cluster


def create(c: Cluster, name: str, node: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": IMAGE, "command": WRITER, "nodeName": node},
    }
    c.objs.create_namespaced_custom_object(GROUP, VERSION, c.namespace, "sandboxes", body)


def get(c: Cluster, name: str) -> dict[str, Any]:
    return dict(c.objs.get_namespaced_custom_object(GROUP, VERSION, c.namespace, "sandboxes", name))


def set_mode(c: Cluster, name: str, mode: str) -> None:
    c.objs.patch_namespaced_custom_object(
        GROUP, VERSION, c.namespace, "sandboxes", name, {"spec": {"operatingMode": mode}}
    )


def suspended(sb: dict[str, Any]) -> tuple[str, str] | None:
    for c in (sb.get("status") or {}).get("conditions") or []:
        if c["type"] == "Suspended":
            return c["status"], c["reason"]
    return None


def running_with_file(c: Cluster, name: str, node: LocalNode) -> dict[str, Any]:
    """``name`` Running on ``node`` (its pid), its file the one rewritten on the first."""

    def probe() -> dict[str, Any] | None:
        sb = get(c, name)
        status = sb.get("status") or {}
        if node_of(sb) != node.name or suspended(sb) != ("False", "Restored"):
            return None
        return sb if status.get("phase") == "Running" and status.get("pid") else None

    sb = wait_for(probe, timeout=60, what=f"{name} running again on {node.name}")
    assert sb["status"]["containerId"] in node.containers()
    assert Path(f"/proc/{sb['status']['pid']}/root/kept").read_text() == f"kept-{name}\n"
    assert "suspendedState" not in sb["status"], sb["status"]
    return sb


def state_registry(registry: Registry) -> RegistryClient:
    """A client of the state repository, with the agents' credential."""
    return RegistryClient(
        Endpoint(f"http://{registry.host}"),
        "sandlot/state",
        Credential(AUTH_USER, AUTH_PASSWORD),
        connect_timeout=5,
        stall_timeout=5,
        deadline=Deadline(20, expired=RuntimeTimeout),
        access=LOOPBACK_ACCESS,
    )


def manifest_gone(registry: Registry, digest: str) -> bool:
    client = state_registry(registry)
    try:
        client.manifest_exists(digest)
    except RegistryError as exc:
        return exc.status == 404
    finally:
        client.close()
    return False


def wait_manifest_gone(registry: Registry, digest: str) -> None:
    wait_for(
        lambda: manifest_gone(registry, digest),
        timeout=30,
        what=f"the pushed state {digest} deleted from the registry",
    )


def started_and_rewritten(c: Cluster, name: str, node: LocalNode) -> dict[str, Any]:
    """Wait for ``name`` Running on ``node``, then rewrite its file (a fresh start
    would write ``written-fresh`` instead)."""
    sb: dict[str, Any] = wait_for(
        lambda: (s := get(c, name)).get("status", {}).get("pid") and s,
        timeout=40,
        what=f"{name} running",
    )
    root = Path(f"/proc/{sb['status']['pid']}/root")
    wait_for(lambda: (root / "kept").exists(), timeout=10, what=f"{name}'s file")
    (root / "kept").write_text(f"kept-{name}\n")
    assert node_of(sb) == node.name
    return sb


def test_a_pushed_sandbox_moves_off_its_cordoned_node_and_runs_there_with_its_files(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    create(moving, "mover", a.name)
    first = started_and_rewritten(moving, "mover", a)

    set_mode(moving, "mover", "Suspended")
    sb = wait_for(
        lambda: (s := get(moving, "mover")).get("status", {}).get("suspendedState") and s,
        timeout=60,
        what="the state pushed",
    )
    state = sb["status"]["suspendedState"]
    assert state["node"] == a.name
    assert state["image"].startswith(
        f"{auth_registry.host}/sandlot/state:{first['metadata']['uid']}@"
    )
    registry = state_registry(auth_registry)
    registry.manifest_exists(state["digest"])  # the registry has it
    registry.close()
    wait_for(lambda: not a.containers(), timeout=20, what="the container removed on a")
    assert node_of(get(moving, "mover")) == a.name, "moved while its node was Ready"

    moving.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", a.name, {"spec": {"unschedulable": True}}
    )
    wait_for(lambda: node_of(get(moving, "mover")) == b.name, timeout=30, what="moved to b")
    assert suspended(get(moving, "mover")) == ("True", "Suspended")  # moved, still suspended

    auth_registry.stop()  # the pull of its state on b fails: b backs off, then tries again
    try:
        set_mode(moving, "mover", "Running")
        wait_for(
            lambda: suspended(get(moving, "mover")) == ("True", "RestorePullBackOff"),
            timeout=30,
            what="the failed pull of mover's state said on its condition",
        )
        assert node_of(get(moving, "mover")) == b.name and not b.containers()
    finally:
        auth_registry.start()
    again = running_with_file(moving, "mover", b)  # no spec change since the failure
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    # Restored, nothing needs the pushed state: b deleted it (a's watch saw the move
    # as a DELETED event, read the Sandbox again and kept it).
    wait_manifest_gone(auth_registry, state["digest"])


def test_drain_move_runs_every_sandbox_of_the_node_elsewhere_with_its_files(
    moving: Cluster, operators: Start, capsys: pytest.CaptureFixture[str], fleet: Fleet
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    names = ("one", "two")
    for name in names:
        create(moving, name, a.name)
    for name in names:
        started_and_rewritten(moving, name, a)

    assert moving.sandlot("nodes", "drain", a.name, "--move", "--timeout", "120s") == 0
    out = capsys.readouterr().out
    for name in names:
        assert f"{moving.namespace}/{name}: moved to {b.name}, running" in out, out
        running_with_file(moving, name, b)
    assert "2 of 2 sandboxes moved" in out, out
    assert not a.containers()
    assert fleet.get_node(a.name)["spec"]["unschedulable"] is True


def test_a_lost_nodes_pushed_sandbox_is_moved_not_marked_dead(
    moving: Cluster, operators: Start
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    create(moving, "survivor", a.name)
    started_and_rewritten(moving, "survivor", a)
    create(moving, "kept-here", a.name)  # not suspended: the lost node takes it
    wait_for(
        lambda: get(moving, "kept-here").get("status", {}).get("phase") == "Running",
        timeout=40,
        what="kept-here running",
    )
    set_mode(moving, "survivor", "Suspended")
    wait_for(
        lambda: get(moving, "survivor").get("status", {}).get("suspendedState"),
        timeout=60,
        what="the state pushed",
    )
    moving.kill_agent(a)
    wait_for(lambda: node_of(get(moving, "survivor")) == b.name, timeout=30, what="moved to b")
    wait_for(
        lambda: get(moving, "kept-here")["status"]["phase"] == "Dead",
        timeout=30,
        what="the lost node's other sandbox marked Dead",
    )
    assert get(moving, "survivor")["status"]["phase"] == "Running"
    set_mode(moving, "survivor", "Running")
    running_with_file(moving, "survivor", b)


def test_a_pushed_snapshot_forks_on_another_node_with_its_files(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    """A snapshot taken on a node with a state repository is pushed there too; with
    its node cordoned a fork is placed on another, whose agent pulls the snapshot and
    starts it with the files it was taken with."""
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    create(moving, "origin", a.name)
    origin = started_and_rewritten(moving, "origin", a)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxSnapshot",
        "metadata": {"name": "shot"},
        "spec": {"sandboxName": "origin"},
    }
    moving.objs.create_namespaced_custom_object(
        GROUP, VERSION, moving.namespace, "sandboxsnapshots", body
    )

    def ready() -> dict[str, Any] | None:
        shot = moving.objs.get_namespaced_custom_object(
            GROUP, VERSION, moving.namespace, "sandboxsnapshots", "shot"
        )
        status = shot.get("status") or {}
        assert status.get("phase") != "Failed", status
        return dict(shot) if status.get("phase") == "Ready" else None

    shot = wait_for(ready, timeout=120, what="snapshot shot Ready")
    pushed = shot["status"]["pushedImage"]
    uid = shot["metadata"]["uid"]
    assert pushed.startswith(f"{auth_registry.host}/sandlot/state:snapshot-{uid}@sha256:"), pushed
    assert shot["spec"]["nodeName"] == a.name

    moving.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", a.name, {"spec": {"unschedulable": True}}
    )
    fork = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "forked"},
        "spec": {"image": IMAGE, "command": WRITER, "snapshotRef": {"name": "shot"}},
    }
    moving.objs.create_namespaced_custom_object(GROUP, VERSION, moving.namespace, "sandboxes", fork)
    running = wait_for(
        lambda: (s := get(moving, "forked")).get("status", {}).get("phase") == "Running" and s,
        timeout=90,
        what="the fork Running",
    )
    assert node_of(running) == b.name, "placed on the snapshot's cordoned node"
    kept = Path(f"/proc/{running['status']['pid']}/root/kept").read_text()
    assert kept == f"kept-{origin['metadata']['name']}\n", kept


def test_a_deleted_suspended_sandboxs_pushed_state_is_deleted_from_the_registry(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    a = moving.add_node("a")
    start_operator(moving, operators)
    create(moving, "gone", a.name)
    started_and_rewritten(moving, "gone", a)
    set_mode(moving, "gone", "Suspended")
    state = wait_for(
        lambda: get(moving, "gone").get("status", {}).get("suspendedState"),
        timeout=60,
        what="the state pushed",
    )
    wait_for(lambda: not a.containers(), timeout=20, what="the container removed on a")
    assert not manifest_gone(auth_registry, state["digest"])  # the registry has it
    moving.objs.delete_namespaced_custom_object(
        GROUP, VERSION, moving.namespace, "sandboxes", "gone"
    )
    wait_manifest_gone(auth_registry, state["digest"])
