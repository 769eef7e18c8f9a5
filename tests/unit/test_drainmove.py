"""What ``drain --move`` does next about one sandbox of the drained node."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.policy.drainmove import MoveOutcome, MoveStep, next_step, waiting_for

NODE = "node-a"


def sb(
    node: str = NODE,
    mode: str = "Suspended",
    phase: str = "Running",
    suspended: tuple[str, str] | None = None,
    pushed: bool = False,
    reason: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "reason": reason, "conditions": []}
    if suspended is not None:
        status["conditions"].append(
            {"type": "Suspended", "status": suspended[0], "reason": suspended[1], "message": "m"}
        )
    if pushed:
        status["suspendedState"] = {"image": "r/s:u@sha256:0", "digest": "sha256:0", "node": NODE}
    return {"spec": {"nodeName": node, "operatingMode": mode}, "status": status}


@pytest.mark.parametrize(
    ("body", "original", "expected"),
    [
        (None, "Running", MoveOutcome(MoveStep.DONE, "deleted")),
        (
            sb(phase="Stopped", reason="Drained", suspended=("True", "Suspended")),
            "Running",
            MoveOutcome(MoveStep.DONE, "ended: Stopped (Drained)"),
        ),
        (sb(), "Running", MoveOutcome(MoveStep.WAIT)),  # not committed yet
        (sb(suspended=("True", "Suspended"), pushed=True), "Running", MoveOutcome(MoveStep.WAIT)),
        (
            sb(suspended=("False", "SuspendFailed")),
            "Running",
            MoveOutcome(MoveStep.DONE, "not moved: m"),
        ),
        (
            sb("node-b", suspended=("True", "Suspended"), pushed=True),
            "Running",
            MoveOutcome(MoveStep.RESTORE_MODE),
        ),
        (
            sb("node-b", "Running", suspended=("True", "Suspended"), pushed=True),
            "Running",
            MoveOutcome(MoveStep.WAIT),  # its new node pulls and starts it
        ),
        (
            sb("node-b", "Running", suspended=("False", "Restored")),
            "Running",
            MoveOutcome(MoveStep.DONE, "moved to node-b, running", moved=True),
        ),
        (
            sb("node-b", "Paused", suspended=("False", "Restored")),
            "Paused",
            MoveOutcome(MoveStep.DONE, "moved to node-b, running", moved=True),
        ),
        (
            sb("node-b", suspended=("True", "Suspended"), pushed=True),
            "Suspended",
            MoveOutcome(MoveStep.DONE, "moved to node-b, suspended", moved=True),
        ),
        (
            sb("node-b", "Running", suspended=("True", "RestoreFailed")),
            "Running",
            MoveOutcome(MoveStep.DONE, "moved to node-b: m"),
        ),
    ],
)
def test_next_step(body: dict[str, Any] | None, original: str, expected: MoveOutcome) -> None:
    assert next_step(body, NODE, original) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (sb(), "its suspension"),
        (sb(suspended=("True", "Suspended")), "its state to be pushed"),
        (sb(suspended=("True", "Suspended"), pushed=True), "a node to move to"),
        (sb("node-b", "Running", suspended=("True", "Suspended")), "its start on the new node"),
    ],
)
def test_a_timed_out_drain_says_what_each_sandbox_waits_for(
    body: dict[str, Any], expected: str
) -> None:
    assert waiting_for(body, NODE) == expected
