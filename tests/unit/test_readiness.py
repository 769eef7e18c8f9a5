"""The Ready verdict of a probed sandbox (``policy.readiness``): thresholds in a row,
a start from what is recorded, a write only on a transition, and when to probe next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from sandlot.api.probe import Probe
from sandlot.api.reasons import ReadyReason
from sandlot.policy.readiness import (
    ProbeResult,
    decide_readiness,
    observed_ready_since,
    probe_target,
    ready_mark,
    sandbox_ready,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
PROBE = Probe.model_validate(
    {"exec": {"command": ["true"]}, "periodSeconds": 5, "successThreshold": 2}
)  # failureThreshold 3 (the default)


def results(*oks: bool) -> tuple[ProbeResult, ...]:
    """One result per 5 s from T0 + 5 s, oldest first."""
    return tuple(
        ProbeResult(T0 + timedelta(seconds=5 * (i + 1)), ok, "exit 0" if ok else "exit 1")
        for i, ok in enumerate(oks)
    )


@pytest.mark.parametrize(
    ("recorded", "oks", "ready", "write"),
    [
        (None, (), False, False),
        (None, (True,), False, False),
        (None, (True, True), True, True),
        (None, (False, False), False, False),
        (None, (False, False, False), False, True),
        (False, (True, True), True, True),
        (False, (False, True), False, False),
        (False, (False, False, False), False, False),
        (True, (), True, False),
        (True, (False, False), True, False),
        (True, (False, True, False, False), True, False),
        (True, (False, False, False), False, True),
        (True, (True,), True, False),
    ],
    ids=[
        "nothing-recorded-nothing-probed-is-not-ready-and-says-nothing",
        "one-pass-below-the-success-threshold-says-nothing",
        "success-threshold-reached-writes-ready",
        "failures-below-the-threshold-say-nothing",
        "failure-threshold-reached-writes-the-first-verdict",
        "not-ready-turns-ready-after-passes-in-a-row",
        "a-pass-after-a-failure-is-not-yet-in-a-row",
        "not-ready-staying-not-ready-is-no-write",
        "a-restarted-agent-keeps-a-recorded-ready",
        "failures-below-the-threshold-keep-ready",
        "failures-must-be-in-a-row",
        "ready-turns-not-ready-after-failures-in-a-row",
        "ready-staying-ready-is-no-write",
    ],
)
def test_the_verdict_flips_only_at_a_threshold_in_a_row(
    recorded: bool | None, oks: tuple[bool, ...], ready: bool, write: bool
) -> None:
    verdict = decide_readiness(PROBE, T0, recorded, results(*oks), T0 + timedelta(minutes=1))
    assert (verdict.ready, verdict.write) == (ready, write)
    assert verdict.reason == (ReadyReason.PROBE_PASSED if ready else ReadyReason.PROBE_FAILED)
    assert verdict.condition().status == ("True" if ready else "False")


def test_the_message_carries_the_last_probes_words() -> None:
    verdict = decide_readiness(PROBE, T0, True, results(False, False, False), T0)
    assert "failed 3 time(s) in a row" in verdict.message and "exit 1" in verdict.message


@pytest.mark.parametrize(
    ("delay", "oks", "now_s", "due_s"),
    [
        (0, (), 0, 0),
        (30, (), 1, 30),
        (30, (), 40, 30),
        (0, (True,), 6, 10),
        (30, (True,), 6, 30),
    ],
    ids=[
        "first-probe-at-once-without-delay",
        "first-probe-after-the-initial-delay-from-the-start",
        "an-overdue-first-probe-is-due-now",
        "next-probe-one-period-after-the-last",
        "the-initial-delay-holds-even-after-a-result",
    ],
)
def test_the_next_probe_is_due_after_the_delay_then_every_period(
    delay: int, oks: tuple[bool, ...], now_s: int, due_s: int
) -> None:
    probe = PROBE.model_copy(update={"initial_delay_seconds": delay})
    verdict = decide_readiness(probe, T0, None, results(*oks), T0 + timedelta(seconds=now_s))
    assert verdict.next_probe_at == T0 + timedelta(seconds=due_s)


@pytest.mark.parametrize(
    ("recorded", "write"), [(None, False), (True, False), (False, True)], ids=str
)
def test_without_a_probe_it_is_ready_and_only_a_stale_not_ready_is_corrected(
    recorded: bool | None, write: bool
) -> None:
    verdict = decide_readiness(None, T0, recorded, (), T0)
    assert (verdict.ready, verdict.reason, verdict.write) == (True, ReadyReason.NO_PROBE, write)
    assert verdict.next_probe_at is None


def _body(
    phase: str, mode: str = "Running", probe: object = None, *extra: dict[str, str]
) -> dict[str, object]:
    spec: dict[str, object] = {"image": "busybox", "operatingMode": mode}
    if probe is not None:
        spec["readinessProbe"] = probe
    conditions = [{"type": "Ready", "status": "True" if extra else "False"}, *extra]
    return {
        "metadata": {"namespace": "ns", "name": "a", "uid": "u1"},
        "spec": spec,
        "status": {"phase": phase, "conditions": conditions},
    }


IDLE_SUSPENDED = {"type": "Suspended", "status": "True", "reason": "Idle"}
SUSPENDED = {"type": "Suspended", "status": "True", "reason": "Suspended"}
RESTORED = {"type": "Suspended", "status": "False", "reason": "Restored"}
IDLE_PAUSED = {"type": "Paused", "status": "True", "reason": "Idle"}
TARGETS = {
    # (phase, spec mode, conditions, a step holds the slot) -> probed
    "running-is-probed": ("Running", "Running", (), False, True),
    "paused-is-not-probed": ("Running", "Paused", (), False, False),
    "not-yet-running-is-not-probed": ("Scheduled", "Running", (), False, False),
    "idle-paused-is-not-probed": ("Running", "Running", (IDLE_PAUSED,), False, False),
    "idle-suspended-has-no-container-to-probe": (
        "Running",
        "Running",
        (IDLE_SUSPENDED,),
        False,
        False,
    ),
    "suspended-by-its-spec-is-not-probed": ("Running", "Suspended", (SUSPENDED,), False, False),
    "restored-is-probed-again": ("Running", "Running", (RESTORED,), False, True),
    "a-step-holding-the-slot-may-freeze-it": ("Running", "Running", (), True, False),
}


@pytest.mark.parametrize(
    ("phase", "mode", "conditions", "busy", "probed"), TARGETS.values(), ids=list(TARGETS)
)
def test_only_a_running_sandbox_no_step_holds_is_a_probe_target(
    phase: str, mode: str, conditions: tuple[dict[str, str], ...], busy: bool, probed: bool
) -> None:
    body = _body(phase, mode, {"tcpSocket": {"port": 80}}, *conditions)
    target = probe_target(body, "sb-u1", T0, busy=busy)
    assert (target is not None) == probed
    if target is not None:
        assert (target.key, target.recorded) == ("ns/a", bool(conditions))
        assert target.probe is not None and target.probe.tcp_socket is not None


@pytest.mark.parametrize(
    ("phase", "has_probe", "recorded", "ready"),
    [
        ("Running", False, None, True),
        ("Running", True, None, False),
        ("Running", True, False, False),
        ("Running", True, True, True),
        ("Scheduled", False, None, False),
        ("Stopped", True, True, False),
    ],
    ids=[
        "no-probe-running-is-ready",
        "probed-without-a-verdict-is-not-ready",
        "probe-failed-is-not-ready",
        "probe-passed-is-ready",
        "not-running-is-not-ready",
        "ended-is-not-ready-whatever-it-recorded",
    ],
)
def test_the_operator_reads_ready_as_running_and_probe_passed_or_absent(
    phase: str, has_probe: bool, recorded: bool | None, ready: bool
) -> None:
    assert sandbox_ready(phase, has_probe, recorded) is ready


def test_a_ready_episode_is_named_by_its_conditions_transition_or_its_start() -> None:
    status = {
        "startedAt": "2026-01-01T12:00:00Z",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T12:01:00Z"}
        ],
    }
    assert ready_mark(status, True) == "2026-01-01T12:01:00Z"
    assert ready_mark(status, False) == "2026-01-01T12:00:00Z"
    assert ready_mark({}, True) is None


SEEN = T0 - timedelta(minutes=5)
OBSERVED = [
    ("first-seen-ready", True, "m1", None, T0),
    ("still-the-same-episode", True, "m1", (SEEN, "m1"), SEEN),
    ("ready-again-since", True, "m2", (SEEN, "m1"), T0),  # a flap the cache missed
    ("was-not-ready", True, "m1", (None, None), T0),
    ("not-ready", False, "m1", (SEEN, "m1"), None),
]


@pytest.mark.parametrize(
    ("ready", "mark", "previous", "since"),
    [r[1:] for r in OBSERVED],
    ids=[r[0] for r in OBSERVED],
)
def test_ready_since_is_when_the_operator_first_saw_the_episode(
    ready: bool,
    mark: str | None,
    previous: tuple[datetime | None, str | None] | None,
    since: datetime | None,
) -> None:
    assert observed_ready_since(ready, mark, previous, T0) == since


@pytest.mark.parametrize(
    "probe",
    [
        {},
        {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}},
        {"tcpSocket": {"port": 0}},
        {"tcpSocket": {"port": 80}, "periodSeconds": 0},
        {"tcpSocket": {"port": 80}, "timeoutSeconds": 61},
        {"tcpSocket": {"port": 80}, "failureThreshold": 0},
        {"exec": {"command": []}},
        {"httpGet": {"port": 80, "path": "no-slash"}},
    ],
    ids=[
        "no-handler",
        "two-handlers",
        "port-zero",
        "period-zero",
        "timeout-past-its-bound",
        "threshold-zero",
        "empty-command",
        "relative-path",
    ],
)
def test_a_probe_outside_its_shape_or_bounds_is_refused(probe: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Probe.model_validate(probe)


def test_a_probe_gets_the_pods_defaults() -> None:
    probe = Probe.model_validate({"httpGet": {"port": 8080}})
    assert (probe.http_get is not None and probe.http_get.path) == "/"
    assert (
        probe.initial_delay_seconds,
        probe.period_seconds,
        probe.timeout_seconds,
        probe.success_threshold,
        probe.failure_threshold,
    ) == (0, 10, 1, 1, 3)
