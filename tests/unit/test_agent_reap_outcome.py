"""How the reaper ends a sandbox whose task exited: ``policy.agentreap.decide_reap``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.agentreap import SandboxEnd, decide_reap
from sandlot.policy.agentsync import SandboxState

CID = "sb-uid-1"
P = SandboxPhase


def sb(phase: SandboxPhase, container_id: str | None = CID) -> SandboxState:
    return SandboxState("ns/box", phase, container_id)


OOM_MESSAGE = "killed by the kernel for exceeding its memory limit (exit code 137)"

ROWS = {
    "running-exits-stopped": (
        sb(P.RUNNING),
        0,
        0,
        SandboxEnd(P.STOPPED, SandboxReason.EXITED, "exited with code 0", 0),
    ),
    "running-exit-code-kept": (
        sb(P.RUNNING),
        3,
        None,
        SandboxEnd(P.STOPPED, SandboxReason.EXITED, "exited with code 3", 3),
    ),
    "scheduled-exits-failed-before-running": (
        sb(P.SCHEDULED, None),
        1,
        0,
        SandboxEnd(P.FAILED, SandboxReason.EXITED_BEFORE_RUNNING, "exited with code 1", 1),
    ),
    "running-oom-killed-is-stopped": (
        sb(P.RUNNING),
        137,
        1,
        SandboxEnd(P.STOPPED, SandboxReason.OOM_KILLED, OOM_MESSAGE, 137),
    ),
    "unstarted-oom-killed-is-failed": (
        sb(P.SCHEDULED, None),
        137,
        2,
        SandboxEnd(P.FAILED, SandboxReason.OOM_KILLED, OOM_MESSAGE, 137),
    ),
    "unknown-exit-code-is-said": (
        sb(P.RUNNING),
        None,
        None,
        SandboxEnd(P.STOPPED, SandboxReason.EXITED, "exited with code None", None),
    ),
    "another-containers-sandbox-is-left-alone": (sb(P.RUNNING, "sb-other"), 0, 0, None),
    "no-sandbox-nothing-to-end": (None, 0, 0, None),
    "stopped-already-ended": (sb(P.STOPPED), 0, 0, None),
    "failed-already-ended": (sb(P.FAILED), 0, 1, None),
    "dead-already-ended": (sb(P.DEAD), 137, 1, None),
    # kept-suspended: a suspend whose task delete failed left its stopped task behind
    "suspended-by-its-spec-is-not-ended": (
        replace(sb(P.RUNNING), mode=OperatingMode.SUSPENDED, suspended=True),
        137,
        0,
        None,
    ),
    "idle-suspended-is-not-ended": (
        replace(sb(P.RUNNING), suspended=True, idle_suspended=True),
        137,
        0,
        None,
    ),
    "suspend-asked-not-recorded-yet-exits-as-any": (
        replace(sb(P.RUNNING), mode=OperatingMode.SUSPENDED),
        0,
        0,
        SandboxEnd(P.STOPPED, SandboxReason.EXITED, "exited with code 0", 0),
    ),
    "paused-and-exited-is-ended": (
        replace(sb(P.RUNNING), mode=OperatingMode.PAUSED, paused=True),
        1,
        0,
        SandboxEnd(P.STOPPED, SandboxReason.EXITED, "exited with code 1", 1),
    ),
}


@pytest.mark.parametrize(("sandbox", "code", "oom", "expected"), ROWS.values(), ids=list(ROWS))
def test_decide_reap(
    sandbox: SandboxState | None, code: int | None, oom: int | None, expected: SandboxEnd | None
) -> None:
    assert decide_reap(sandbox, CID, code, oom) == expected
