"""policy.imagepull: the kubelet's pull policies and ImagePullBackOff, on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.policy.imagepull import (
    FailureKind,
    PullAction,
    PullHistory,
    PullPolicy,
    decide_pull,
    pull_backoff,
)
from tests.support.clock import FakeClock

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CREATED = T0 - timedelta(minutes=1)


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
        (PullPolicy.ALWAYS, True, PullHistory(succeeded_at=T0), PullAction.RUN, ""),
        (
            PullPolicy.ALWAYS,
            True,
            PullHistory(succeeded_at=CREATED - timedelta(seconds=1)),
            PullAction.PULL,
            "Pulling",
        ),
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
        "always-shares-a-pull-done-since-creation",
        "always-ignores-a-pull-older-than-the-sandbox",
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
    decision = decide_pull(policy, present=present, history=history, wanted_since=CREATED, now=T0)
    assert (decision.action, decision.reason) == (action, reason)


def test_failed_pull_backs_off_then_retries_at_the_exact_moment() -> None:
    clock = FakeClock(T0)
    history = _failed(1, FailureKind.TRANSIENT, clock.now())

    def decide() -> object:
        return decide_pull(
            PullPolicy.IF_NOT_PRESENT,
            present=False,
            history=history,
            wanted_since=CREATED,
            now=clock.now(),
        )

    first = decide()
    assert first.action is PullAction.BACK_OFF  # type: ignore[attr-defined]
    assert first.reason == "ImagePullBackOff"  # type: ignore[attr-defined]
    assert first.retry_at == T0 + timedelta(seconds=10)  # type: ignore[attr-defined]
    assert "the registry said so" in first.message  # type: ignore[attr-defined]
    clock.advance(9.999)
    assert decide().action is PullAction.BACK_OFF  # type: ignore[attr-defined]
    clock.advance(0.001)
    assert decide().action is PullAction.PULL  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kinds", "action"),
    [
        ([FailureKind.NOT_FOUND] * 2, PullAction.BACK_OFF),
        ([FailureKind.NOT_FOUND] * 3, PullAction.FAIL),
        ([FailureKind.UNAUTHORIZED] * 3, PullAction.FAIL),
        ([FailureKind.NOT_FOUND, FailureKind.UNAUTHORIZED, FailureKind.NOT_FOUND], PullAction.FAIL),
        ([FailureKind.TRANSIENT] * 50, PullAction.BACK_OFF),
        ([FailureKind.NOT_FOUND] * 2 + [FailureKind.TRANSIENT], PullAction.BACK_OFF),
    ],
    ids=[
        "two-not-found-back-off",
        "three-not-found-fail",
        "three-refused-credentials-fail",
        "final-kinds-mixed-fail",
        "transient-never-fails",
        "a-transient-failure-resets-the-final-count",
    ],
)
def test_only_final_failures_in_a_row_end_the_sandbox(
    kinds: list[FailureKind], action: PullAction
) -> None:
    history = PullHistory()
    for kind in kinds:
        history = history.failed(kind, "msg", T0)
    decision = decide_pull(
        PullPolicy.IF_NOT_PRESENT, present=False, history=history, wanted_since=CREATED, now=T0
    )
    assert decision.action is action
    if action is PullAction.FAIL:
        assert decision.reason == "ErrImagePull"


def test_success_clears_the_failures() -> None:
    history = _failed(4, FailureKind.TRANSIENT).succeeded(T0)
    assert (history.failures, history.final_failures, history.succeeded_at) == (0, 0, T0)
