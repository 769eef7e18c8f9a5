"""The CachePrune decisions: targets, nodes that can never answer, and the phase."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from sandlot.api.node import NodePhase
from sandlot.policy.cacheprune import (
    NodeReach,
    decide,
    prune_phase,
    resolve_targets,
    unreachable_reason,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ALIVE = NOW + timedelta(seconds=30)
EXPIRED = NOW - timedelta(seconds=5)


def reach(phase: NodePhase | None, expires: datetime | None) -> NodeReach:
    return NodeReach(phase=phase, lease_expires_at=expires)


@pytest.mark.parametrize(
    ("spec_nodes", "existing", "expected"),
    [
        (["b", "a"], ["a", "b", "c"], ("b", "a")),
        (["a", "a", "b"], ["a"], ("a", "b")),
        ([], ["c", "a", "b"], ("a", "b", "c")),
        ([], [], ()),
        (["ghost"], ["a"], ("ghost",)),
    ],
    ids=[
        "named-nodes-in-the-order-given",
        "duplicates-dropped",
        "empty-means-every-node-sorted",
        "no-nodes-at-all-targets-nothing",
        "named-node-kept-even-if-it-does-not-exist",
    ],
)
def test_targets_are_the_named_nodes_or_every_node(
    spec_nodes: list[str], existing: list[str], expected: tuple[str, ...]
) -> None:
    assert resolve_targets(spec_nodes, existing) == expected


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (None, 'node "n" does not exist'),
        (reach(NodePhase.READY, ALIVE), None),
        (reach(NodePhase.NOT_READY, EXPIRED), 'node "n" is NotReady: its agent is not running'),
        (reach(NodePhase.NOT_READY, None), "it has no agent lease"),
        (reach(NodePhase.NOT_READY, ALIVE), None),
        (reach(NodePhase.DISABLED, ALIVE), None),
        (reach(NodePhase.DISABLED, EXPIRED), 'node "n" is Disabled and its agent is not running'),
        (reach(NodePhase.READY, EXPIRED), 'node "n" is NotReady: its agent is not running'),
        (reach(None, None), None),
        (reach(NodePhase.NOT_READY, NOW), "its agent is not running"),
    ],
    ids=[
        "missing-node-does-not-exist",
        "ready-node-with-fresh-lease-waits",
        "notready-node-with-expired-lease-refused",
        "notready-node-without-lease-refused-saying-so",
        "stale-notready-phase-but-fresh-lease-waits",
        "drained-node-with-running-agent-waits",
        "drained-node-with-dead-agent-refused",
        "stale-ready-phase-but-expired-lease-refused",
        "node-not-judged-yet-waits",
        "lease-expiring-exactly-now-is-expired",
    ],
)
def test_a_node_whose_agent_cannot_answer_gets_a_reason(
    node: NodeReach | None, expected: str | None
) -> None:
    reason = unreachable_reason("n", node, NOW)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_expired_lease_reason_names_the_expiry_time() -> None:
    reason = unreachable_reason("n", reach(NodePhase.NOT_READY, EXPIRED), NOW)
    assert reason is not None and EXPIRED.isoformat() in reason


@pytest.mark.parametrize(
    ("targets", "results", "expected"),
    [
        (("a", "b"), {"a": None}, "Running"),
        (("a", "b"), {"a": "boom"}, "Running"),
        (("a", "b"), {"a": None, "b": None}, "Complete"),
        (("a", "b"), {"a": None, "b": "disk gone"}, "Failed"),
        ((), {}, "Complete"),
        (("a",), {"a": None, "stranger": "boom"}, "Complete"),
    ],
    ids=[
        "running-while-a-result-is-missing",
        "running-while-missing-even-with-an-error",
        "complete-when-all-reported-without-error",
        "failed-when-any-reported-an-error",
        "no-targets-is-complete",
        "results-of-non-targets-do-not-count",
    ],
)
def test_phase_follows_the_targets_results(
    targets: tuple[str, ...], results: Mapping[str, str | None], expected: str
) -> None:
    assert prune_phase(targets, results) == expected


def test_pending_request_resolves_every_node_and_refuses_the_dead_ones_at_once() -> None:
    nodes = {
        "up": reach(NodePhase.READY, ALIVE),
        "down": reach(NodePhase.NOT_READY, EXPIRED),
    }
    d = decide(
        all_=True,
        spec_nodes=[],
        current_phase=None,
        current_targets=[],
        results={},
        nodes=nodes,
        now=NOW,
    )
    assert d.targets == ("down", "up")
    assert set(d.errors) == {"down"} and "NotReady" in d.errors["down"]
    assert d.phase == "Running" and d.pass_kind == "forced"
    assert d.changes(None, [])


def test_unknown_node_fails_the_request_once_the_others_answered() -> None:
    d = decide(
        all_=False,
        spec_nodes=["up", "ghost"],
        current_phase="Pending",
        current_targets=[],
        results={"up": None},
        nodes={"up": reach(NodePhase.READY, ALIVE)},
        now=NOW,
    )
    assert d.targets == ("up", "ghost")
    assert d.errors == {"ghost": 'node "ghost" does not exist'}
    assert d.phase == "Failed" and d.pass_kind == "watermark"


def test_resolved_targets_stay_fixed_when_nodes_appear_later() -> None:
    d = decide(
        all_=True,
        spec_nodes=[],
        current_phase="Running",
        current_targets=["a"],
        results={},
        nodes={"a": reach(NodePhase.READY, ALIVE), "late": reach(NodePhase.READY, ALIVE)},
        now=NOW,
    )
    assert d.targets == ("a",) and not d.errors and d.phase == "Running"
    assert not d.changes("Running", ["a"])


def test_a_node_that_answered_is_never_judged_again() -> None:
    d = decide(
        all_=True,
        spec_nodes=["a"],
        current_phase="Running",
        current_targets=["a"],
        results={"a": None},
        nodes={"a": reach(NodePhase.NOT_READY, EXPIRED)},
        now=NOW,
    )
    assert not d.errors and d.phase == "Complete"
    assert d.changes("Running", ["a"]) and not d.changes("Complete", ["a"])


def test_target_deleted_after_resolution_gets_an_error() -> None:
    d = decide(
        all_=False,
        spec_nodes=[],
        current_phase="Running",
        current_targets=["gone"],
        results={},
        nodes={},
        now=NOW,
    )
    assert d.errors == {"gone": 'node "gone" does not exist'} and d.phase == "Failed"
