"""Idle auto-pause: when a sandbox counts as idle, and what an idle pause settles."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.keys import CLAIM_LABEL, POOL_LABEL, SANDBOX_LABEL
from sandlot.api.sandbox import OperatingMode
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import ActionKind, SandboxState, plan_sync
from sandlot.policy.idle import (
    IdleSample,
    IdleStep,
    IdleTrack,
    claim_wakes,
    idle_condition,
    idle_timeout,
    observe,
    thaws_for_stream,
    unclaimed_member,
    wake_condition,
)
from sandlot.policy.operatingmode import idle_paused, mode_pending, stream_refusal
from sandlot.policy.readiness import probe_target

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TIMEOUT = timedelta(seconds=60)
THRESHOLD = 0.01  # cores
SECOND_NS = 10**9


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(samples: list[tuple[float, int, int | None]]) -> list[IdleStep]:
    """Feed (seconds, sessions, cpu_ns) samples in order; the step after each."""
    track: IdleTrack | None = None
    steps = []
    for seconds, sessions, cpu in samples:
        track, step = observe(
            track,
            IdleSample(at=at(seconds), sessions=sessions, cpu_ns=cpu),
            timeout=TIMEOUT,
            threshold_cores=THRESHOLD,
        )
        steps.append(step)
    return steps


W, P = IdleStep.WATCH, IdleStep.PAUSE

CASES = [
    ("quiet-past-timeout", [(0, 0, 0), (30, 0, 0), (60, 0, 0)], [W, W, P]),
    ("a-first-sample-never-pauses", [(120, 0, 0)], [W]),
    ("quiet-short-of-timeout", [(0, 0, 0), (59, 0, 0)], [W, W]),
    (
        "cpu-below-threshold-is-quiet",
        [(0, 0, 0), (30, 0, SECOND_NS // 1000), (60, 0, SECOND_NS // 500)],
        [W, W, P],
    ),
    (
        "cpu-above-threshold-restarts-the-clock",
        [(0, 0, 0), (30, 0, SECOND_NS), (60, 0, SECOND_NS), (90, 0, SECOND_NS)],
        [W, W, W, P],
    ),
    ("an-open-session-restarts-the-clock", [(0, 0, 0), (50, 1, 0), (100, 0, 0)], [W, W, W]),
    ("quiet-after-the-session-ends", [(0, 1, 0), (10, 0, 0), (70, 0, 0)], [W, W, P]),
    ("an-unreadable-cpu-counts-as-use", [(0, 0, 0), (30, 0, None), (61, 0, 0)], [W, W, W]),
    ("a-cpu-counter-that-went-back-is-quiet", [(0, 0, 5), (30, 0, 0), (60, 0, 0)], [W, W, P]),
]


@pytest.mark.parametrize(("samples", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_observe_pauses_only_after_the_timeout_without_sessions_or_cpu(
    samples: list[tuple[float, int, int | None]], expected: list[IdleStep]
) -> None:
    assert run(samples) == expected


def sandbox(
    *,
    seconds: int | None = 60,
    phase: str = "Running",
    mode: str = "Running",
    paused: tuple[str, str] | None = None,
    suspended: bool = False,
) -> dict[str, Any]:
    conditions = []
    if paused is not None:
        conditions.append({"type": "Paused", "status": paused[0], "reason": paused[1]})
    if suspended:
        conditions.append({"type": "Suspended", "status": "True", "reason": "Suspended"})
    spec: dict[str, Any] = {"operatingMode": mode}
    if seconds is not None:
        spec["idleTimeoutSeconds"] = seconds
    return {
        "metadata": {"namespace": "ns", "name": "sb", "generation": 1},
        "spec": spec,
        "status": {"phase": phase, "containerId": "c1", "conditions": conditions},
    }


ELIGIBLE = [
    ("running-with-a-timeout", sandbox(), TIMEOUT),
    ("no-timeout-is-off", sandbox(seconds=None), None),
    ("not-running", sandbox(phase="Scheduled"), None),
    ("spec-asks-for-paused", sandbox(mode="Paused"), None),
    ("paused-already", sandbox(paused=("True", "Idle")), None),
    ("resumed-after-an-idle-pause", sandbox(paused=("False", "Resumed")), TIMEOUT),
    ("suspended", sandbox(suspended=True), None),
]


@pytest.mark.parametrize(
    ("obj", "expected"), [c[1:] for c in ELIGIBLE], ids=[c[0] for c in ELIGIBLE]
)
def test_idle_timeout_applies_only_to_a_running_sandbox_the_spec_wants_running(
    obj: dict[str, Any], expected: timedelta | None
) -> None:
    assert idle_timeout(obj) == expected


PENDING = [
    ("idle-pause-settles-running", OperatingMode.RUNNING, True, False),
    ("spec-paused-takes-over-an-idle-pause", OperatingMode.PAUSED, True, True),
    ("user-pause-still-resumed-by-running", OperatingMode.RUNNING, False, True),
]


@pytest.mark.parametrize(
    ("mode", "idle", "pending"), [c[1:] for c in PENDING], ids=[c[0] for c in PENDING]
)
def test_an_idle_pause_is_not_undone_by_the_sync(
    mode: OperatingMode, idle: bool, pending: bool
) -> None:
    assert mode_pending(mode, paused=True, failed=False, idle=idle) is pending


def test_the_sync_leaves_an_idle_paused_sandbox_frozen() -> None:
    obj = sandbox(paused=("True", "Idle"))
    state = SandboxState.from_object(obj)
    assert state.idle_paused and state.paused
    container = ContainerView(id="c1", labels={SANDBOX_LABEL: "ns/sb"})
    actions = plan_sync([state], [container], drained=False, in_flight=())
    assert not [a for a in actions if a.kind is ActionKind.APPLY_MODE]


def test_idle_and_wake_conditions_say_the_reason_and_the_way_back() -> None:
    paused = idle_condition("node-a", TIMEOUT, 3)
    assert (paused.status, paused.reason, paused.observed_generation) == ("True", "Idle", 3)
    assert "spec.idleTimeoutSeconds" in paused.message and "exec" in paused.message
    obj = sandbox(paused=("True", "Idle"))
    assert idle_paused(obj)
    woken = wake_condition("node-a", "exec", 3)
    assert (woken.status, woken.reason) == ("False", "Resumed")
    assert "exec" in woken.message
    assert not idle_paused(sandbox(paused=("True", "Paused")))


def test_a_pause_the_spec_asks_for_is_still_refused_naming_the_field() -> None:
    refusal = stream_refusal(sandbox(mode="Paused", paused=("True", "Idle")), "exec")
    assert refusal is not None and "spec.operatingMode" in refusal


def labelled(labels: dict[str, str], paused: tuple[str, str] | None = ("True", "Idle")) -> Any:
    obj = sandbox(paused=paused)
    obj["metadata"]["labels"] = labels
    return obj


CLAIMS = [
    ("claimed-after-an-unclaimed-pause", labelled({CLAIM_LABEL: "c"}), True, True),
    ("paused-after-its-claim-waits-for-use", labelled({CLAIM_LABEL: "c"}), False, False),
    ("still-unclaimed", labelled({POOL_LABEL: "p"}), True, False),
    (
        "claimed-but-resumed-already",
        labelled({CLAIM_LABEL: "c"}, ("False", "Resumed")),
        True,
        False,
    ),
    (
        "claimed-but-paused-by-its-spec",
        labelled({CLAIM_LABEL: "c"}, ("True", "Paused")),
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("obj", "paused_unclaimed", "wakes"), [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS]
)
def test_a_claim_resumes_only_a_member_idle_paused_before_it_was_claimed(
    obj: dict[str, Any], paused_unclaimed: bool, wakes: bool
) -> None:
    assert claim_wakes(obj, paused_unclaimed) is wakes


def test_an_unclaimed_member_carries_its_pools_label() -> None:
    assert unclaimed_member(labelled({POOL_LABEL: "p"}))
    assert not unclaimed_member(labelled({CLAIM_LABEL: "c"}))


def test_an_idle_paused_sandbox_is_not_probed() -> None:
    assert probe_target(sandbox(), "c1", None, busy=False) is not None
    assert probe_target(sandbox(paused=("True", "Idle")), "c1", None, busy=False) is None


def test_a_pause_the_spec_asks_for_waits_while_a_stream_is_open() -> None:
    obj = sandbox(mode="Paused", paused=("False", "ResumedForUse"))
    state = SandboxState.from_object(obj)
    container = ContainerView(id="c1", labels={SANDBOX_LABEL: "ns/sb"})
    in_use = plan_sync([state], [container], drained=False, in_flight=(), in_use={"ns/sb"})
    assert in_use == []
    ended = plan_sync([state], [container], drained=False, in_flight=())
    assert [a.kind for a in ended] == [ActionKind.APPLY_MODE]


def test_a_thaw_for_use_under_a_paused_spec_says_it_is_frozen_again_after() -> None:
    c = wake_condition("node-a", "exec", 4, spec_paused=True)
    assert (c.status, c.reason) == ("False", "ResumedForUse")
    assert "spec.operatingMode" in c.message and "streams end" in c.message


THAWS = [
    ("idle-paused-always", sandbox(paused=("True", "Idle")), False, True),
    ("running-nothing-to-thaw", sandbox(), True, False),
    (
        "spec-paused-refused-by-default",
        sandbox(mode="Paused", paused=("True", "Paused")),
        False,
        False,
    ),
    ("spec-paused-thawed-when-set", sandbox(mode="Paused", paused=("True", "Paused")), True, True),
    ("suspended-never", sandbox(mode="Paused", suspended=True), True, False),
    ("spec-suspended-never", sandbox(mode="Suspended"), True, False),
]


@pytest.mark.parametrize(
    ("obj", "paused_resume", "thaws"), [c[1:] for c in THAWS], ids=[c[0] for c in THAWS]
)
def test_a_stream_thaws_an_idle_pause_always_and_a_spec_pause_only_when_set(
    obj: dict[str, Any], paused_resume: bool, thaws: bool
) -> None:
    assert thaws_for_stream(obj, paused_resume) is thaws
