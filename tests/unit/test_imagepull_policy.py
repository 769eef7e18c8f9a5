"""policy.pulling.decision: the kubelet's pull policies and ImagePullBackOff, on a fake clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from sandlot.policy.pulling.decision import (
    FailureKind,
    PullAction,
    PullDecision,
    PullHistory,
    PullPolicy,
    decide_pull,
    pull_backoff,
)
from tests.support.clock import FakeClock

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# Pull number 1 succeeded: the sandbox joined it, or asked only after it ended.
DONE_FOR_IT = PullHistory(succeeded_at=T0, started=1, succeeded_pull=1)
DONE_BEFORE = PullHistory(succeeded_at=T0, started=1, succeeded_pull=1, failures=0)


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(0, 0), (1, 10), (2, 20), (3, 40), (5, 160), (6, 300), (7, 300), (400, 300)],
    ids=["none", "first", "second", "third", "fifth", "capped", "stays-capped", "huge"],
)
def test_backoff_doubles_from_ten_seconds_and_is_capped_at_five_minutes(
    failures: int, seconds: int
) -> None:
    assert pull_backoff(failures) == timedelta(seconds=seconds)


def test_backoff_honours_its_own_base_and_cap() -> None:
    base, cap = timedelta(seconds=1), timedelta(seconds=5)
    waits = [pull_backoff(n, base=base, cap=cap).total_seconds() for n in range(1, 6)]
    assert waits == [1, 2, 4, 5, 5]


def _failed(n: int, kind: FailureKind, at: datetime = T0) -> PullHistory:
    history = PullHistory()
    for _ in range(n):
        history = history.failed(kind, f"{kind}: the registry said so", at)
    return history


@pytest.mark.parametrize(
    ("policy", "present", "history", "action", "reason"),
    [
        (PullPolicy.IF_NOT_PRESENT, True, PullHistory(), PullAction.RUN, ""),
        (PullPolicy.IF_NOT_PRESENT, False, PullHistory(), PullAction.PULL, "Pulling"),
        (PullPolicy.ALWAYS, True, PullHistory(), PullAction.PULL, "Pulling"),
        (PullPolicy.ALWAYS, True, DONE_FOR_IT, PullAction.RUN, ""),
        (PullPolicy.ALWAYS, True, DONE_BEFORE, PullAction.PULL, "Pulling"),
        (PullPolicy.NEVER, True, PullHistory(), PullAction.RUN, ""),
        (PullPolicy.NEVER, False, PullHistory(), PullAction.FAIL, "ImageNotFound"),
        (
            PullPolicy.NEVER,
            False,
            _failed(5, FailureKind.NOT_FOUND),
            PullAction.FAIL,
            "ImageNotFound",
        ),
        (
            PullPolicy.IF_NOT_PRESENT,
            False,
            PullHistory(in_flight=True),
            PullAction.WAIT,
            "Pulling",
        ),
        (PullPolicy.ALWAYS, True, PullHistory(in_flight=True), PullAction.WAIT, "Pulling"),
    ],
    ids=[
        "if-not-present-present-runs",
        "if-not-present-absent-pulls",
        "always-pulls-though-present",
        "always-runs-after-the-pull-it-joined",
        "always-ignores-a-pull-it-did-not-join",
        "never-present-runs",
        "never-absent-fails",
        "never-never-pulls-even-after-failures",
        "in-flight-waits",
        "always-in-flight-waits",
    ],
)
def test_policy_decides_like_the_kubelet(
    policy: PullPolicy, present: bool, history: PullHistory, action: PullAction, reason: str
) -> None:
    joined = 1 if history is DONE_FOR_IT else None
    decision = decide_pull(policy, present=present, history=history, joined=joined, now=T0)
    assert (decision.action, decision.reason) == (action, reason)


def test_failed_pull_backs_off_then_retries_at_the_exact_moment() -> None:
    clock = FakeClock(T0)
    history = _failed(1, FailureKind.TRANSIENT, clock.now())

    def decide() -> PullDecision:
        return decide_pull(
            PullPolicy.IF_NOT_PRESENT,
            present=False,
            history=history,
            joined=None,
            now=clock.now(),
        )

    first = decide()
    assert first.action is PullAction.BACK_OFF
    assert first.reason == "ImagePullBackOff"
    assert first.retry_at == T0 + timedelta(seconds=10)
    assert "the registry said so" in first.message
    clock.advance(9.999)
    assert decide().action is PullAction.BACK_OFF
    clock.advance(0.001)
    assert decide().action is PullAction.PULL


@pytest.mark.parametrize(
    ("kinds", "action"),
    [
        ([FailureKind.NOT_FOUND] * 2, PullAction.BACK_OFF),
        ([FailureKind.NOT_FOUND] * 3, PullAction.FAIL),
        ([FailureKind.UNAUTHORIZED] * 3, PullAction.FAIL),
        ([FailureKind.NOT_FOUND, FailureKind.UNAUTHORIZED, FailureKind.NOT_FOUND], PullAction.FAIL),
        ([FailureKind.TRANSIENT] * 50, PullAction.BACK_OFF),
        ([FailureKind.NOT_FOUND] * 2 + [FailureKind.TRANSIENT], PullAction.BACK_OFF),
        ([FailureKind.TOO_LARGE] * 3, PullAction.FAIL),
    ],
    ids=[
        "two-not-found-back-off",
        "three-not-found-fail",
        "three-refused-credentials-fail",
        "final-kinds-mixed-fail",
        "transient-never-fails",
        "a-transient-failure-resets-the-final-count",
        "three-too-large-fail",
    ],
)
def test_only_final_failures_in_a_row_end_the_sandbox(
    kinds: list[FailureKind], action: PullAction
) -> None:
    history = PullHistory()
    for kind in kinds:
        history = history.failed(kind, "msg", T0)
    decision = decide_pull(
        PullPolicy.IF_NOT_PRESENT, present=False, history=history, joined=None, now=T0
    )
    assert decision.action is action
    if action is PullAction.FAIL:
        too_large = kinds[-1] is FailureKind.TOO_LARGE
        assert decision.reason == ("ImageTooLarge" if too_large else "ErrImagePull")


def test_a_later_pull_in_flight_is_waited_for_and_an_older_success_does_not_count() -> None:
    history = PullHistory(started=2, succeeded_pull=1, in_flight=True)
    assert (
        decide_pull(PullPolicy.ALWAYS, present=True, history=history, joined=2, now=T0).action
        is PullAction.WAIT
    )
    done = PullHistory(started=2, succeeded_pull=1)  # pull 2 failed: pull 1 is not ours
    assert (
        decide_pull(PullPolicy.ALWAYS, present=True, history=done, joined=2, now=T0).action
        is PullAction.PULL
    )


def test_success_clears_the_failures() -> None:
    history = replace(_failed(4, FailureKind.TRANSIENT), started=5).succeeded(T0)
    assert (history.failures, history.final_failures, history.succeeded_at) == (0, 0, T0)
    assert history.succeeded_pull == history.started == 5
