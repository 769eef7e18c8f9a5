"""When the scheduler moves a suspended sandbox whose state was pushed."""

from __future__ import annotations

import pytest

from sandlot.api.node import NodePhase
from sandlot.policy.statemove import movable_object, move_wanted, state_movable

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
    ("movable", "node_phase", "wanted"),
    [
        (True, NodePhase.DISABLED, True),  # cordoned: a drain
        (True, NodePhase.NOT_READY, True),
        (True, None, True),  # its node is gone
        (True, NodePhase.READY, False),  # it starts again where it is, without a pull
        (False, NodePhase.DISABLED, False),
        (False, None, False),
    ],
)
def test_a_movable_sandbox_moves_only_off_a_node_that_cannot_start_it(
    movable: bool, node_phase: NodePhase | None, wanted: bool
) -> None:
    assert move_wanted(movable, node_phase) is wanted


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
