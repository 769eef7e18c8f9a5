"""When the scheduler moves a suspended sandbox whose state was pushed: off a
cordoned or deleted node at once, off a lost one only once node health handled it
(its grace over, the mass-failure guard not holding), never off a Ready one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.api.node import NodeHealthTracking, NodePhase
from sandlot.policy.nodehealth import episode_handled
from sandlot.policy.statemove import movable_object, move_wanted, state_movable

GRACE = timedelta(seconds=300)

SUSPENDED = (("Suspended", "True", "Suspended"),)
RESTORED = (("Suspended", "False", "Restored"),)


@pytest.mark.parametrize(
    ("phase", "conditions", "state_node", "movable"),
    [
        ("Running", SUSPENDED, "node-a", True),
        ("Running", SUSPENDED, None, False),  # its state is on its node only
        ("Running", RESTORED, "node-a", False),  # running again: nothing to move
        ("Running", (), "node-a", False),
        ("Stopped", SUSPENDED, "node-a", False),  # ended: it goes nowhere
        ("Pending", SUSPENDED, "node-a", False),
    ],
)
def test_only_a_running_suspended_sandbox_with_pushed_state_is_movable(
    phase: str, conditions: tuple[tuple[str, str, str], ...], state_node: str | None, movable: bool
) -> None:
    assert state_movable(phase, conditions, state_node) is movable


@pytest.mark.parametrize(
    ("movable", "node_phase", "handled", "wanted"),
    [
        (True, NodePhase.DISABLED, False, True),  # cordoned: a drain moves it at once
        (True, NodePhase.NOT_READY, True, True),  # lost, and node health handled it
        # NotReady within its grace, or held by the mass-failure guard: its agent may
        # be alive and only cut off, and restore it there while another node does.
        (True, NodePhase.NOT_READY, False, False),
        (True, None, False, True),  # its node is gone
        (True, NodePhase.READY, True, False),  # it starts again where it is, without a pull
        (False, NodePhase.DISABLED, False, False),
        (False, NodePhase.NOT_READY, True, False),
        (False, None, False, False),
    ],
    ids=[
        "cordoned",
        "lost-and-handled",
        "lost-not-handled",
        "node-gone",
        "ready",
        "not-movable-cordoned",
        "not-movable-lost",
        "not-movable-gone",
    ],
)
def test_a_movable_sandbox_moves_only_off_a_node_that_cannot_start_it(
    movable: bool, node_phase: NodePhase | None, handled: bool, wanted: bool
) -> None:
    assert move_wanted(movable, node_phase, handled) is wanted


EXPIRY = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("tracking", "handled"),
    [
        (None, False),
        (NodeHealthTracking(), False),
        (NodeHealthTracking(unhealthy_since=EXPIRY), False),  # within grace, or held
        (NodeHealthTracking(unhealthy_since=EXPIRY, handled_at=EXPIRY + GRACE), True),
        # Renewed after the latch and lost again: a new episode, not handled yet.
        (
            NodeHealthTracking(
                unhealthy_since=EXPIRY - timedelta(hours=1),
                handled_at=EXPIRY - timedelta(hours=1) + GRACE,
            ),
            False,
        ),
    ],
    ids=["no-status", "untracked", "tracked-not-handled", "handled", "handled-episode-before"],
)
def test_a_nodes_episode_is_handled_only_by_its_own_latch(
    tracking: NodeHealthTracking | None, handled: bool
) -> None:
    assert episode_handled(tracking, EXPIRY) is handled


def body(phase: str, suspended: str, pushed: bool) -> dict[str, object]:
    status: dict[str, object] = {
        "phase": phase,
        "conditions": [{"type": "Suspended", "status": suspended, "reason": "Suspended"}],
    }
    if pushed:
        status["suspendedState"] = {"image": "r/s:u@sha256:0", "digest": "sha256:0", "node": "a"}
    return {"status": status}


def test_a_lost_nodes_marking_leaves_only_pushed_suspended_sandboxes_alone() -> None:
    from sandlot.controllers.marking import _live

    assert movable_object(body("Running", "True", True))
    assert not _live(body("Running", "True", True))
    assert _live(body("Running", "True", False))  # its state is on the lost node
    assert _live(body("Running", "False", True))
    assert not movable_object({"status": {}}) and _live({"status": {}})
