"""Which CachePrune requests a node's agent answers: ``policy.agentprune``."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.policy.agentprune import (
    PruneAnswer,
    PruneRequest,
    answers_to_remember,
    prunes_to_answer,
)

NODE = "n1"


def req(uid: str = "u1", **fields: Any) -> PruneRequest:
    return PruneRequest(uid=uid, name=f"prune-{uid}", **fields)


ROWS: dict[str, tuple[PruneRequest, frozenset[str], PruneAnswer | None]] = {
    "every-node-request-is-answered": (
        req(),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "watermark"),
    ),
    "all-runs-the-forced-pass": (
        req(all=True),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "forced"),
    ),
    "request-naming-this-node": (
        req(nodes=("n0", NODE)),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "watermark"),
    ),
    "request-naming-other-nodes-only": (req(nodes=("n0", "n2")), frozenset(), None),
    "this-node-already-has-a-result": (req(answered_by=frozenset({NODE})), frozenset(), None),
    "another-nodes-result-does-not-count": (
        req(answered_by=frozenset({"n0"})),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "watermark"),
    ),
    "answered-but-event-not-back-yet": (req(), frozenset({"u1"}), None),
    "running-and-targeted": (
        req(phase="Running", targets=(NODE,)),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "watermark"),
    ),
    "resolved-before-this-node-registered": (
        req(phase="Running", targets=("n0",)),
        frozenset(),
        None,
    ),
    "complete-without-this-node": (req(phase="Complete"), frozenset(), None),
    "explicit-pending-is-answered": (
        req(phase="Pending"),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "watermark"),
    ),
    "unknown-target-answered-with-error": (
        req(target="registry"),
        frozenset(),
        PruneAnswer("u1", "prune-u1", "watermark", "unknown target 'registry'"),
    ),
}


@pytest.mark.parametrize(("request_", "answered", "expected"), ROWS.values(), ids=list(ROWS))
def test_prune_eligibility(
    request_: PruneRequest, answered: frozenset[str], expected: PruneAnswer | None
) -> None:
    got = prunes_to_answer([request_], NODE, answered)
    assert got == ([] if expected is None else [expected])


def test_request_read_from_the_object() -> None:
    obj = {
        "metadata": {"name": "weekly", "uid": "u9"},
        "spec": {"nodes": ["n1"], "all": True},
        "status": {"phase": "Running", "targets": ["n1"], "results": {"n0": {}}},
    }
    assert PruneRequest.from_object(obj) == PruneRequest(
        uid="u9",
        name="weekly",
        nodes=("n1",),
        answered_by=frozenset({"n0"}),
        phase="Running",
        targets=("n1",),
        all=True,
        target="containerd",
    )


def test_answers_are_forgotten_once_their_request_is_gone() -> None:
    assert answers_to_remember({"u1", "u2"}, [req("u2"), req("u3")]) == {"u2"}


def test_answers_keep_request_order() -> None:
    got = prunes_to_answer([req("b"), req("a")], NODE, set())
    assert [a.uid for a in got] == ["b", "a"]
