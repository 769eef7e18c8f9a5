"""The sandbox cache keeps the newest view it was given while comparing
resourceVersions for equality only: the judgements as plain data, then the cache
fed the orders a watch and the controllers' answers really arrive in.

Versions here are opaque words chosen so that neither their numeric nor their
lexical order is the order they were written in: a judgement that ordered them
would fail these tables."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.controllers.sandboxes import PASSED_VERSIONS, SandboxCache, SandboxRecord
from sandlot.policy.freshness import Awaited, Judgement, judge_answer, judge_event

LAG = 10.0
NOW = 1000.0

# Written in this order: "m" < "c" < "x" < "b" < "k" (neither numeric nor lexical).
M, C, X, B, K = "m", "c", "x", "b", "k"


@pytest.mark.parametrize(
    ("held", "passed", "answer", "awaited", "expected"),
    [
        (C, (M, C), C, None, Judgement(False, None)),
        (C, (M, C), X, None, Judgement(True, Awaited(X, NOW + LAG))),
        (X, (M, C, X), C, None, Judgement(False, None)),
        (X, (M, C), B, Awaited(X, NOW + 1), Judgement(True, Awaited(B, NOW + LAG))),
        (X, (M,), X, Awaited(X, NOW + 1), Judgement(False, Awaited(X, NOW + 1))),
        (X, (M, C), M, Awaited(X, NOW + 1), Judgement(False, Awaited(X, NOW + 1))),
        (None, (), M, None, Judgement(True, Awaited(M, NOW + LAG))),
    ],
    ids=[
        "answer-equal-to-the-view-changes-nothing",
        "answer-the-watch-has-not-delivered-is-taken-and-awaited",
        "answer-the-watch-went-past-is-stale",
        "later-answer-replaces-the-awaited-one",
        "same-answer-twice-keeps-the-wait",
        "answer-older-than-an-awaited-one-the-watch-delivered-is-stale",
        "first-answer-about-an-unknown-sandbox-is-taken",
    ],
)
def test_judge_answer(
    held: str | None,
    passed: tuple[str, ...],
    answer: str,
    awaited: Awaited | None,
    expected: Judgement,
) -> None:
    assert judge_answer(held, passed, answer, awaited, NOW, watch_lag=LAG) == expected


@pytest.mark.parametrize(
    ("awaited", "event", "held", "now", "expected"),
    [
        (None, C, M, NOW, Judgement(True, None)),
        (None, C, C, NOW, Judgement(False, None)),
        (Awaited(X, NOW + 5), C, X, NOW, Judgement(False, Awaited(X, NOW + 5))),
        (Awaited(X, NOW + 5), X, X, NOW, Judgement(False, None)),
        (Awaited(X, NOW + 5), B, X, NOW + 5, Judgement(True, None)),
        (Awaited(X, NOW + 5), B, X, NOW + 4.999, Judgement(False, Awaited(X, NOW + 5))),
    ],
    ids=[
        "nothing-awaited-a-new-version-is-taken",
        "nothing-awaited-the-held-version-changes-nothing",
        "event-before-the-awaited-version-is-older-and-dropped",
        "the-awaited-version-ends-the-wait",
        "after-the-bound-the-watch-is-believed-again",
        "just-before-the-bound-still-dropped",
    ],
)
def test_judge_event(
    awaited: Awaited | None, event: str, held: str, now: float, expected: Judgement
) -> None:
    assert judge_event(awaited, event, held, now) == expected


# -- the cache, fed in the orders that happen ---------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def body(version: str, phase: str = "Pending", node: str | None = None, uid: str = "u1") -> Any:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "sb",
            "uid": uid,
            "resourceVersion": version,
            "creationTimestamp": "2026-01-01T12:00:00Z",
        },
        "spec": {"image": "registry.example/app:1", **({"nodeName": node} if node else {})},
        "status": {"phase": phase},
    }


def held(cache: SandboxCache) -> SandboxRecord:
    rec = cache.get("ns/sb")
    assert rec is not None, "the sandbox is not in the cache"
    return rec


def fresh() -> tuple[SandboxCache, Clock, list[tuple[str | None, str | None]]]:
    clock = Clock()
    cache = SandboxCache(clock=clock, watch_lag=LAG)
    changes: list[tuple[str | None, str | None]] = []
    cache.listeners.append(
        lambda old, new: changes.append(
            (old.resource_version if old else None, new.resource_version if new else None)
        )
    )
    return cache, clock, changes


def test_watch_event_older_than_the_own_write_does_not_undo_it() -> None:
    cache, _, changes = fresh()
    cache.on_event(None, body(M))
    cache.upsert(body(X, "Scheduled", "n1"))  # the bind's answer
    cache.on_event("MODIFIED", body(C))  # written by someone before the bind: older
    assert held(cache).resource_version == X and held(cache).node == "n1"
    assert cache.node_load["n1"] == 1
    cache.on_event("MODIFIED", body(X, "Scheduled", "n1"))  # the bind, through the watch
    cache.on_event("MODIFIED", body(B, "Running", "n1"))  # the agent's write, newer
    assert held(cache).phase == "Running"
    assert changes == [(None, M), (M, X), (X, B)], "every change once, none undone"


def test_answer_the_watch_went_past_is_stale() -> None:
    cache, _, changes = fresh()
    cache.on_event(None, body(M))
    # The bind's answer comes back only after the watch delivered it and a newer write.
    cache.on_event("MODIFIED", body(X, "Scheduled", "n1"))
    cache.on_event("MODIFIED", body(B, "Running", "n1"))
    assert cache.upsert(body(X, "Scheduled", "n1")) is held(cache)
    assert held(cache).phase == "Running"
    cache.on_event("MODIFIED", body(K, "Stopped", "n1"))  # nothing is awaited: taken at once
    assert held(cache).phase == "Stopped"
    assert changes == [(None, M), (M, X), (X, B), (B, K)]


def test_read_of_the_version_held_changes_nothing() -> None:
    cache, _, changes = fresh()
    cache.on_event(None, body(M))
    assert cache.upsert(body(M)) is held(cache)
    cache.on_event("MODIFIED", body(C, "Running", "n1"))
    assert held(cache).phase == "Running", "an equal answer must not start a wait"
    assert changes == [(None, M), (M, C)]


def test_listing_older_than_the_own_write_does_not_undo_it() -> None:
    cache, _, _ = fresh()
    cache.on_event(None, body(M))
    cache.upsert(body(X, "Scheduled", "n1"))
    cache.on_event(None, body(M))  # a re-list read before the bind, delivered after it
    assert held(cache).resource_version == X
    cache.on_event("MODIFIED", body(X, "Scheduled", "n1"))  # the watch resumes from the list
    cache.on_event("MODIFIED", body(C, "Running", "n1"))
    assert held(cache).phase == "Running"


def test_awaited_version_a_relist_skipped_stops_being_awaited_at_the_bound() -> None:
    cache, clock, _ = fresh()
    cache.on_event(None, body(M))
    cache.upsert(body(X, "Scheduled", "n1"))
    # The watch expired; the re-list read after two more writes: X never comes.
    cache.on_event(None, body(B, "Running", "n1"))
    assert held(cache).resource_version == X, "within the bound it may still be older"
    clock.now += LAG
    cache.on_event("MODIFIED", body(K, "Stopped", "n1"))
    assert held(cache).phase == "Stopped", "after the bound the watch is believed again"
    assert cache.node_load["n1"] == 0


def test_later_answer_replaces_the_awaited_one() -> None:
    cache, _, _ = fresh()
    cache.on_event(None, body(M))
    cache.upsert(body(X, "Pending", "n1"))  # bound
    cache.upsert(body(B, "Scheduled", "n1"))  # then marked Scheduled
    cache.on_event("MODIFIED", body(X, "Pending", "n1"))  # the bind, through the watch
    assert held(cache).phase == "Scheduled"
    cache.on_event("MODIFIED", body(B, "Scheduled", "n1"))
    cache.on_event("MODIFIED", body(K, "Running", "n1"))
    assert held(cache).phase == "Running"


def test_recreated_sandbox_is_taken_whatever_is_awaited() -> None:
    cache, _, _ = fresh()
    cache.on_event(None, body(M))
    cache.upsert(body(X, "Scheduled", "n1"))
    cache.on_event("MODIFIED", body(C, uid="u2"))  # deleted and created again meanwhile
    assert held(cache).uid == "u2" and held(cache).node is None
    cache.on_event("MODIFIED", body(B, "Scheduled", "n2", uid="u2"))
    assert held(cache).node == "n2"


def test_stale_answer_beyond_the_remembered_versions_heals_at_the_bound() -> None:
    cache, clock, _ = fresh()
    cache.on_event(None, body(M))
    cache.on_event("MODIFIED", body(X, "Scheduled", "n1"))
    later = [f"v{i}" for i in range(PASSED_VERSIONS)]
    for version in later:
        cache.on_event("MODIFIED", body(version, "Running", "n1"))
    cache.upsert(body(X, "Scheduled", "n1"))  # too old to be recognised
    clock.now += LAG
    cache.on_event("MODIFIED", body(K, "Stopped", "n1"))
    assert held(cache).phase == "Stopped"


def test_sandbox_deleted_by_the_operator_is_not_brought_back() -> None:
    cache, _, _ = fresh()
    cache.on_event(None, body(M))
    cache.forget("ns/sb", "u1")
    cache.on_event("MODIFIED", body(C))
    assert cache.upsert(body(X)) is None
    assert cache.get("ns/sb") is None
