"""A node restores a suspended sandbox only while it is still that node's (SPEC
section 8: at most one node runs a sandbox). The agent plans a restore on its
watched view, which may lag a move the scheduler made to another node; a fresh
read decides, and an unreadable Sandbox (an agent cut off from the API server) is
not restored either."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from urllib3.exceptions import ProtocolError

from sandlot.agent.sync import restore_fenced
from sandlot.policy.statemove import restore_refusal
from sandlot.policy.suspension import SuspendStep, suspended_image_name
from tests.unit.test_suspension import CID, KEY, NODE, World, cond


def body(node: str | None, uid: str = "u1") -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"namespace": "ns", "name": "box", "uid": uid}, "spec": spec}


@pytest.mark.parametrize(
    ("current", "why"),
    [
        (body(NODE), None),
        (body("node-b"), "it was moved to node node-b"),
        (None, "it was deleted"),
        (body(NODE, uid="u2"), "it was deleted (another sandbox has its name)"),
    ],
    ids=["still-here", "moved-away", "deleted", "another-of-that-name"],
)
def test_a_restore_stands_only_on_the_node_a_fresh_read_names(
    current: dict[str, Any] | None, why: str | None
) -> None:
    assert restore_refusal(current, "u1", NODE) == why


def suspended_world() -> tuple[World, dict[str, Any]]:
    """A sandbox suspended on this node, asked to run again: the watched view."""
    recorded = cond("True", "Suspended", 1) | {"message": "committed"}
    world = World("Running", container=False, conditions=[recorded])
    return world, world.body()


def test_a_sandbox_moved_away_is_not_restored_on_the_node_its_watch_still_shows() -> None:
    world, seen = suspended_world()
    world.objects.sandboxes[KEY]["spec"]["nodeName"] = "node-b"  # the scheduler moved it
    world.objects.touch(world.objects.sandboxes[KEY])
    find = world.objects.find_sandbox
    assert restore_fenced(find, NODE, world.suspensions.restore, seen, None) is None
    assert world.work.restarted == [] and CID not in world.rt.containers
    assert world.condition().reason == "Suspended", "a status written for a moved sandbox"


def test_an_unreadable_sandbox_is_not_restored_and_the_next_pass_asks_again() -> None:
    world, seen = suspended_world()
    world.objects.fail_next("get", ProtocolError("connection reset"))
    find, restore = world.objects.find_sandbox, world.suspensions.restore
    assert restore_fenced(find, NODE, restore, seen, None) is None
    assert world.work.restarted == []
    assert restore_fenced(find, NODE, restore, seen, None) is SuspendStep.RESTORE
    assert world.work.restarted == [suspended_image_name(world.uid)]


def test_a_sandbox_still_here_is_restored_from_the_fresh_read() -> None:
    world, seen = suspended_world()
    stale = copy.deepcopy(seen)
    world.objects.touch(world.objects.sandboxes[KEY])  # changed since the watch showed it
    find = world.objects.find_sandbox
    assert restore_fenced(find, NODE, world.suspensions.restore, stale, None) is SuspendStep.RESTORE
    assert world.work.restarted == [suspended_image_name(world.uid)]
    c = world.condition()
    assert (c.status, c.reason) == ("False", "Restored"), "the fresh read's version not written"
