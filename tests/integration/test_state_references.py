"""Pushed and committed state that something still names is never deleted, and a
restore finds its state wherever it is.

The rig of tests/integration/test_state_move.py: a real operator process, real
agents on their own containerd namespaces, every agent pushing suspended state to
the loopback registry behind htpasswd. A snapshot of a suspended sandbox is pushed
as its own manifest (``snapshot-<uid>``, sealed under the snapshot's key): neither
the restore nor the deletion of the sandbox takes it, and a fork on another node
starts from it. A sandbox moved away and back, whose committed image its first node
collected meanwhile, runs again there from the registry. A push the registry
refused while it was down is owed, not forgotten: a drain keeps the sandbox until
the push succeeds, then it moves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.teardown import teardown
from sandlot.api.common import GROUP, VERSION
from sandlot.policy.snapshots import snapshot_image_name
from sandlot.policy.suspension import suspended_image_name
from tests.integration.test_agent_node import CALL_TIMEOUT, KILL_WAIT
from tests.integration.test_agent_node import IMAGE as NODE_IMAGE
from tests.integration.test_agent_suspend import busybox_archive, ctr_ns, rt
from tests.integration.test_state_move import (
    WRITER,
    create,
    get,
    manifest_gone,
    moving,
    running_with_file,
    set_mode,
    started_and_rewritten,
    suspended,
    wait_manifest_gone,
)
from tests.support.containerd import scratch_spec
from tests.support.pools import IMAGE, Cluster, LocalNode, Start, node_of, start_operator
from tests.support.registry import Registry
from tests.support.wait import wait_for

pytest_plugins = ["tests.support.registry"]
pytestmark = [pytest.mark.containerd, pytest.mark.integration]

__all__ = ["busybox_archive", "ctr_ns", "moving", "rt"]  # fixtures, imported by name


def snapshot_of(c: Cluster, name: str, sandbox: str) -> dict[str, Any]:
    """SandboxSnapshot ``name`` of ``sandbox``, once Ready (its pushed copy's reference)."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxSnapshot",
        "metadata": {"name": name},
        "spec": {"sandboxName": sandbox},
    }
    c.objs.create_namespaced_custom_object(GROUP, VERSION, c.namespace, "sandboxsnapshots", body)

    def ready() -> dict[str, Any] | None:
        shot = c.objs.get_namespaced_custom_object(
            GROUP, VERSION, c.namespace, "sandboxsnapshots", name
        )
        status = shot.get("status") or {}
        assert status.get("phase") != "Failed", status
        return dict(shot) if status.get("phase") == "Ready" else None

    shot: dict[str, Any] = wait_for(ready, timeout=120, what=f"snapshot {name} Ready")
    assert shot["status"].get("pushedImage"), shot["status"]
    return shot


def suspend_pushed(c: Cluster, name: str, node: LocalNode) -> dict[str, Any]:
    """Suspend ``name`` and wait for its state pushed and its container gone."""
    cid = get(c, name)["status"]["containerId"]
    set_mode(c, name, "Suspended")
    state: dict[str, Any] = wait_for(
        lambda: get(c, name).get("status", {}).get("suspendedState"),
        timeout=60,
        what=f"{name}'s state pushed",
    )
    wait_for(lambda: cid not in node.containers(), timeout=20, what=f"{name}'s container removed")
    return state


def test_a_snapshots_pushed_copy_outlives_its_sandboxs_restore_and_forks_elsewhere(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    ns = moving.namespace
    create(moving, "origin", a.name)
    started_and_rewritten(moving, "origin", a)
    state = suspend_pushed(moving, "origin", a)
    shot = snapshot_of(moving, "shot", "origin")
    copy = shot["status"]["pushedImage"].rsplit("@", 1)[1]
    assert copy != state["digest"], "the snapshot's copy is not sealed under its own key"
    set_mode(moving, "origin", "Running")
    running_with_file(moving, "origin", a)
    # Restored, nothing names its state: the operator deletes it; the copy stays.
    wait_manifest_gone(auth_registry, state["digest"])
    assert not manifest_gone(auth_registry, copy), "the snapshot's copy was deleted"

    # A fork on another node starts from the registry's copy.
    moving.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", a.name, {"spec": {"unschedulable": True}}
    )
    fork = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "forked"},
        "spec": {"image": IMAGE, "command": WRITER, "snapshotRef": {"name": "shot"}},
    }
    moving.objs.create_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes", fork)
    running = wait_for(
        lambda: (s := get(moving, "forked")).get("status", {}).get("phase") == "Running" and s,
        timeout=90,
        what="the fork Running on another node",
    )
    assert node_of(running) == b.name
    assert Path(f"/proc/{running['status']['pid']}/root/kept").read_text() == "kept-origin\n"


def test_a_snapshots_pushed_copy_outlives_its_suspended_sandboxs_deletion_then_goes_with_it(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    a = moving.add_node("a")
    start_operator(moving, operators)
    ns = moving.namespace
    create(moving, "doomed", a.name)
    started_and_rewritten(moving, "doomed", a)
    state = suspend_pushed(moving, "doomed", a)
    copy = snapshot_of(moving, "shot", "doomed")["status"]["pushedImage"].rsplit("@", 1)[1]
    moving.objs.delete_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes", "doomed")
    wait_manifest_gone(auth_registry, state["digest"])
    assert not manifest_gone(auth_registry, copy), "the snapshot's copy went with its sandbox"

    # The snapshot (nothing forks it) goes, and its copy with it.
    moving.objs.delete_namespaced_custom_object(GROUP, VERSION, ns, "sandboxsnapshots", "shot")
    wait_manifest_gone(auth_registry, copy)


def test_a_sandbox_moved_away_and_back_is_pulled_when_its_local_copy_was_collected(
    moving: Cluster, operators: Start
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    create(moving, "traveller", a.name)
    first = started_and_rewritten(moving, "traveller", a)
    state = suspend_pushed(moving, "traveller", a)
    assert state["node"] == a.name

    def cordon(node: LocalNode, on: bool) -> None:
        moving.objs.patch_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", node.name, {"spec": {"unschedulable": on}}
        )

    cordon(a, True)
    wait_for(lambda: node_of(get(moving, "traveller")) == b.name, timeout=30, what="moved to b")
    # Away on b: a's image collector removes the committed image nobody there names.
    assert a.runtime is not None
    a.runtime.delete_image(suspended_image_name(first["metadata"]["uid"]), timeout=10)
    cordon(a, False)
    cordon(b, True)
    wait_for(lambda: node_of(get(moving, "traveller")) == a.name, timeout=30, what="back on a")
    assert get(moving, "traveller")["status"]["suspendedState"]["node"] == a.name

    set_mode(moving, "traveller", "Running")

    def restored_or_refused() -> bool:
        condition = suspended(get(moving, "traveller"))
        assert condition != ("True", "RestoreFailed"), get(moving, "traveller")["status"]
        return condition == ("False", "Restored")

    wait_for(restored_or_refused, timeout=60, what="traveller restored on a")
    running_with_file(moving, "traveller", a)


def test_a_drain_keeps_a_sandbox_whose_push_is_owed_until_it_is_pushed_and_moved(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    create(moving, "owed", a.name)
    started_and_rewritten(moving, "owed", a)

    auth_registry.stop()  # the suspend's push meets a registry that is down
    try:
        set_mode(moving, "owed", "Suspended")
        wait_for(
            lambda: suspended(get(moving, "owed")) == ("True", "PushPending"),
            timeout=60,
            what="the failed push said owed on the condition",
        )
        wait_for(lambda: not a.containers(), timeout=20, what="the container removed on a")
        moving.objs.patch_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", a.name, {"spec": {"unschedulable": True}}
        )

        def tried_again_on_the_drained_node() -> bool:
            sb = get(moving, "owed")
            assert sb["status"]["phase"] == "Running", f"ended: {sb['status']}"
            message = next(
                c["message"] for c in sb["status"]["conditions"] if c["type"] == "Suspended"
            )
            return "(failure 2)" in message

        wait_for(
            tried_again_on_the_drained_node,
            timeout=30,
            what="the owed push tried again on the drained node, the sandbox kept",
        )
    finally:
        auth_registry.start()
    wait_for(
        lambda: get(moving, "owed").get("status", {}).get("suspendedState"),
        timeout=60,
        what="the owed push done once the registry is back",
    )
    wait_for(lambda: node_of(get(moving, "owed")) == b.name, timeout=30, what="moved to b")
    set_mode(moving, "owed", "Running")
    running_with_file(moving, "owed", b)


def test_removing_a_committed_images_name_keeps_what_a_snapshots_name_holds(
    rt: ContainerdRuntime,
) -> None:
    """The image collector removes a suspended sandbox's image by name; a snapshot
    taken of it while suspended is a second name of the same manifest, and forks
    start from it after containerd's garbage collection."""
    cid = "committed"
    spec = scratch_spec(["sh", "-c", "echo kept > /kept; sleep 1000"], cid, host_network=True)
    rt.create_container(
        ContainerSpec(id=cid, image=NODE_IMAGE, oci_spec=spec, labels={}), timeout=10
    )
    rt.start_task(cid, stdio="", timeout=10)
    wait_for(
        lambda: (Path(rt.writable_layer(cid, timeout=5)) / "kept").exists(),
        timeout=10,
        what="the file in the writable layer",
    )
    suspended_name, shot_name = suspended_image_name("sb-uid"), snapshot_image_name("shot-uid")
    digest = rt.commit_container(cid, suspended_name, {}, timeout=30)
    teardown(rt, cid, kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)
    assert rt.copy_image(suspended_name, shot_name, {}, timeout=10) == digest
    rt.delete_image(suspended_name, timeout=10)
    rt.collect_garbage(timeout=30)

    fork = "fork"
    spec = scratch_spec(["sleep", "1000"], fork, host_network=True)
    rt.create_container(
        ContainerSpec(id=fork, image=shot_name, oci_spec=spec, labels={}), timeout=10
    )
    rt.start_task(fork, stdio="", timeout=10)
    try:
        task = rt.get_task(fork, timeout=5)
        assert task is not None
        assert Path(f"/proc/{task.pid}/root/kept").read_text() == "kept\n"
    finally:
        teardown(rt, fork, kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)
