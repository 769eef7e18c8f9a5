"""The gateway's remembered access reviews (``policy.reviewcache``, and
``gateway.reviews`` over it): only a clean allow is kept, only for exactly the same
question, only ``ttl`` seconds from when it was asked, and never more than the bound."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from sandlot.gateway.reviews import API, CACHE, CachedReviews
from sandlot.policy.reviewcache import ReviewCache, fresh, keepable, review_key
from sandlot.policy.streamaccess import Caller, access_review_spec
from sandlot.policy.streams import EXEC, FILES, LOG, StreamRequest

ALLOW = {"allowed": True}
ANN = Caller("ann", ("team-a", "system:authenticated"), {"scopes": ("x",)}, "uid-1")
EXEC_SB = StreamRequest(EXEC, "ns", "sb", command=("true",))


def spec(caller: Caller = ANN, request: StreamRequest = EXEC_SB) -> dict[str, Any]:
    return access_review_spec(caller, request)


@pytest.mark.parametrize(
    ("asked_at", "now", "ttl", "expected"),
    [
        (100.0, 100.0, 5.0, True),
        (100.0, 104.999, 5.0, True),
        (100.0, 105.0, 5.0, False),
        (100.0, 99.0, 5.0, False),
        (100.0, 100.0, 0.0, False),
    ],
    ids=["just-asked", "just-inside", "at-the-ttl", "clock-before-the-question", "ttl-0-disables"],
)
def test_an_answer_stands_ttl_seconds_from_when_it_was_asked(
    asked_at: float, now: float, ttl: float, expected: bool
) -> None:
    assert fresh(asked_at, now, ttl) is expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"allowed": True}, True),
        ({"allowed": True, "reason": "RBAC: allowed by RoleBinding"}, True),
        ({"allowed": False}, False),
        ({}, False),
        ({"allowed": True, "denied": True}, False),
        ({"allowed": False, "denied": True, "reason": "no"}, False),
        ({"allowed": True, "evaluationError": "webhook timed out"}, False),
        ({"allowed": "true"}, False),
    ],
    ids=[
        "allow",
        "allow-with-reason",
        "no-opinion",
        "empty",
        "denied-wins",
        "denial",
        "allow-beside-an-error",
        "not-a-boolean",
    ],
)
def test_only_a_clean_allow_is_kept(status: dict[str, Any], expected: bool) -> None:
    assert keepable(status) is expected


@pytest.mark.parametrize(
    "other",
    [
        spec(Caller("bob", ANN.groups, ANN.extra, ANN.uid)),
        spec(Caller(ANN.user, ("team-a",), ANN.extra, ANN.uid)),
        spec(Caller(ANN.user, ANN.groups, {"scopes": ("y",)}, ANN.uid)),
        spec(Caller(ANN.user, ANN.groups, {}, ANN.uid)),
        spec(Caller(ANN.user, ANN.groups, ANN.extra, "uid-2")),
        spec(request=StreamRequest(LOG, "ns", "sb")),
        spec(request=StreamRequest(FILES, "ns", "sb", op="read", path="/x")),
        spec(request=StreamRequest(EXEC, "other", "sb", command=("true",))),
        spec(request=StreamRequest(EXEC, "ns", "sb2", command=("true",))),
    ],
    ids=[
        "user",
        "groups",
        "extra",
        "no-extra",
        "uid",
        "subresource-and-verb",
        "files-verb",
        "namespace",
        "name",
    ],
)
def test_an_allow_answers_only_exactly_the_same_question(other: dict[str, Any]) -> None:
    cache = ReviewCache(ttl=5.0, max_entries=100)
    cache.remember(review_key(spec()), ALLOW, asked_at=0.0)
    assert review_key(other) != review_key(spec())
    assert cache.answer(review_key(other), 1.0) is None
    assert cache.answer(review_key(spec()), 1.0) == ALLOW


def test_the_key_does_not_depend_on_the_order_of_the_specs_keys() -> None:
    one = spec()
    reordered = dict(reversed(list(one.items())))
    assert review_key(reordered) == review_key(one)


def test_an_allow_stands_until_its_ttl_then_is_forgotten() -> None:
    cache = ReviewCache(ttl=5.0, max_entries=10)
    cache.remember("q", ALLOW, asked_at=10.0)
    assert cache.answer("q", 14.9) == ALLOW
    assert cache.answer("q", 15.0) is None
    assert len(cache) == 0


def test_a_denial_is_never_kept_and_forgets_an_allow_of_the_same_question() -> None:
    cache = ReviewCache(ttl=5.0, max_entries=10)
    cache.remember("q", {"allowed": False, "reason": "no"}, asked_at=0.0)
    assert cache.answer("q", 0.0) is None
    cache.remember("q", ALLOW, asked_at=1.0)
    cache.remember("q", {"allowed": False}, asked_at=2.0)
    assert cache.answer("q", 2.0) is None


def test_ttl_0_keeps_nothing() -> None:
    cache = ReviewCache(ttl=0.0, max_entries=10)
    cache.remember("q", ALLOW, asked_at=0.0)
    assert cache.answer("q", 0.0) is None
    assert len(cache) == 0


def test_past_the_bound_the_oldest_goes_first_and_expired_ones_go_at_once() -> None:
    cache = ReviewCache(ttl=5.0, max_entries=3)
    for i, name in enumerate("abcd"):
        cache.remember(name, ALLOW, asked_at=float(i) / 10)
    assert len(cache) == 3
    assert cache.answer("a", 0.5) is None
    assert [cache.answer(n, 0.5) for n in "bcd"] == [ALLOW] * 3
    cache.remember("e", ALLOW, asked_at=5.25)  # b (0.1) and c (0.2) have expired
    assert len(cache) == 2
    assert cache.answer("d", 5.25) == ALLOW


@pytest.mark.parametrize(
    ("ttl", "max_entries"), [(-1.0, 10), (5.0, 0)], ids=["negative-ttl", "no-room"]
)
def test_a_cache_that_cannot_work_is_refused(ttl: float, max_entries: int) -> None:
    with pytest.raises(ValueError):
        ReviewCache(ttl, max_entries)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reviewer:
    """The API server's answers, as the gateway's ``Backends.review`` gives them."""

    def __init__(self, status: Mapping[str, Any]) -> None:
        self.status = status
        self.asked: list[Mapping[str, Any]] = []

    def __call__(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        self.asked.append(spec)
        return self.status


def cached(
    reviewer: Reviewer, clock: FakeClock, ttl: float = 5.0
) -> tuple[CachedReviews, list[str]]:
    sources: list[str] = []
    return (
        CachedReviews(reviewer, ttl=ttl, max_entries=100, clock=clock, on_answer=sources.append),
        sources,
    )


def test_the_same_allowed_question_is_asked_once_per_ttl() -> None:
    clock, reviewer = FakeClock(), Reviewer(ALLOW)
    reviews, sources = cached(reviewer, clock)
    assert reviews(spec()) == ALLOW
    clock.now += 4.9
    assert reviews(spec()) == ALLOW
    assert len(reviewer.asked) == 1
    clock.now += 0.1  # 5 s after the question: asked again
    assert reviews(spec()) == ALLOW
    assert len(reviewer.asked) == 2
    assert sources == [API, CACHE, API]


def test_a_revoked_allow_is_honoured_once_the_kept_one_expires() -> None:
    clock, reviewer = FakeClock(), Reviewer(ALLOW)
    reviews, _ = cached(reviewer, clock)
    reviews(spec())
    reviewer.status = {"allowed": False, "reason": "RoleBinding deleted"}
    clock.now += 5.0
    assert reviews(spec())["allowed"] is False


def test_a_denied_caller_is_asked_every_time() -> None:
    clock, reviewer = FakeClock(), Reviewer({"allowed": False})
    reviews, sources = cached(reviewer, clock)
    for _ in range(3):
        assert reviews(spec())["allowed"] is False
    assert len(reviewer.asked) == 3
    assert sources == [API] * 3
    reviewer.status = ALLOW  # granted: the very next question is allowed
    assert reviews(spec()) == ALLOW


def test_a_failed_review_raises_and_keeps_nothing() -> None:
    clock = FakeClock()
    calls = 0

    def failing(_spec: Mapping[str, Any]) -> Mapping[str, Any]:
        nonlocal calls
        calls += 1
        raise TimeoutError("the API server did not answer")

    reviews = CachedReviews(failing, ttl=5.0, max_entries=10, clock=clock)
    for _ in range(2):
        with pytest.raises(TimeoutError):
            reviews(spec())
    assert calls == 2 and len(reviews) == 0


def test_ttl_0_asks_every_time() -> None:
    clock, reviewer = FakeClock(), Reviewer(ALLOW)
    reviews, sources = cached(reviewer, clock, ttl=0.0)
    reviews(spec())
    reviews(spec())
    assert len(reviewer.asked) == 2 and sources == [API, API]
