"""Which node may hold which state key (``policy.statekeys``): plain data in, the
owners out."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.policy.statekeys import (
    brokered_key,
    key_secret_name,
    node_keys,
    orphaned_keys,
    owner_of_secret,
)


def sandbox(
    uid: str, node: str | None, phase: str = "Running", fork: str | None = None, ns: str = "t"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": "i"}
    if node:
        spec["nodeName"] = node
    if fork:
        spec["snapshotRef"] = {"name": fork}
    return {
        "metadata": {"namespace": ns, "name": f"sb-{uid}", "uid": uid},
        "spec": spec,
        "status": {"phase": phase},
    }


def snapshot(
    uid: str, node: str, phase: str = "Ready", pushed: bool = True, ns: str = "t"
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if pushed:
        status["pushedImage"] = f"r/s:snapshot-{uid}@sha256:{'0' * 64}"
    return {
        "metadata": {"namespace": ns, "name": f"shot-{uid}", "uid": uid},
        "spec": {"sandboxName": "x", "nodeName": node},
        "status": status,
    }


CASES = [
    ("own-running-sandbox", [sandbox("s1", "a")], [], {"s1"}),
    ("another-nodes-sandbox", [sandbox("s1", "b")], [], set()),
    ("moved-away-sandbox-is-the-new-nodes", [sandbox("s1", "b", phase="Running")], [], set()),
    ("terminal-sandbox", [sandbox("s1", "a", phase="Stopped")], [], set()),
    ("unbound-sandbox", [sandbox("s1", None, phase="Pending")], [], set()),
    (
        "fork-gets-its-pushed-snapshots-key",
        [sandbox("s1", "a", fork="shot-p1")],
        [snapshot("p1", "b")],
        {"s1", "p1"},
    ),
    (
        "fork-of-an-unpushed-snapshot-gets-no-snapshot-key",
        [sandbox("s1", "a", fork="shot-p1")],
        [snapshot("p1", "b", pushed=False)],
        {"s1"},
    ),
    (
        "fork-names-a-snapshot-of-another-namespace",
        [sandbox("s1", "a", fork="shot-p1")],
        [snapshot("p1", "b", ns="other")],
        {"s1"},
    ),
    (
        "snapshot-being-taken-here",
        [],
        [snapshot("p1", "a", phase="Taking", pushed=False)],
        {"p1"},
    ),
    ("snapshot-taken-here-and-ready", [], [snapshot("p1", "a")], set()),
    ("snapshot-being-taken-elsewhere", [], [snapshot("p1", "b", phase="Taking")], set()),
]


@pytest.mark.parametrize(
    ("sandboxes", "snapshots", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_node_holds_only_the_keys_of_what_it_runs_now(
    sandboxes: list[dict[str, Any]], snapshots: list[dict[str, Any]], expected: set[str]
) -> None:
    assert node_keys("a", sandboxes, snapshots) == frozenset(expected)


def test_a_sandbox_moved_to_another_node_takes_its_key_there() -> None:
    before = [sandbox("s1", "a")]
    after = [sandbox("s1", "b")]
    assert "s1" in node_keys("a", before, []) and "s1" not in node_keys("b", before, [])
    assert "s1" not in node_keys("a", after, []) and "s1" in node_keys("b", after, [])


def test_keys_of_owners_that_are_gone_are_orphaned() -> None:
    live = [sandbox("s1", "a")]
    shots = [snapshot("p1", "a")]
    assert orphaned_keys(["s1", "p1", "gone", "also"], live, shots) == ["also", "gone"]


def test_names_round_trip_and_never_collide_with_other_brokered_keys() -> None:
    assert owner_of_secret(key_secret_name("u-1")) == "u-1"
    assert owner_of_secret("sandlot-pull-node") is None
    # A pull secret's brokered key is "<namespace>.<name>", a reference's
    # "_secret.<ns>.<name>" or "_configmap.<ns>.<name>".
    assert brokered_key("u-1") == "_state.u-1"
