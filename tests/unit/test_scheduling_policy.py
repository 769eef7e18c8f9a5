"""The scheduler's choice: Ready, not Disabled, free capacity; spread a pool, then load."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.api.node import NodePhase
from sandlot.policy.scheduling import NodeSlot, SandboxRequest, Unschedulable, choose_node

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
R, N, D = NodePhase.READY, NodePhase.NOT_READY, NodePhase.DISABLED
POOL = "ns/web"


def node(
    name: str,
    phase: NodePhase = R,
    *,
    capacity: int = 10,
    load: int = 0,
    pool: int = 0,
    unschedulable: bool = False,
    ready_until: datetime | None = None,
) -> NodeSlot:
    return NodeSlot(
        name=name,
        phase=D if unschedulable else phase,
        unschedulable=unschedulable,
        capacity=capacity,
        sandboxes=load,
        pool_members={POOL: pool} if pool else {},
        ready_until=ready_until,
    )


@pytest.mark.parametrize(
    ("nodes", "pool", "expected"),
    [
        ([node("a", load=3), node("b", load=1), node("c", load=2)], None, "b"),
        ([node("a", pool=2, load=2), node("b", pool=1, load=5), node("c", pool=2)], POOL, "b"),
        ([node("a", pool=1, load=4), node("b", pool=1, load=2)], POOL, "b"),
        ([node("b"), node("a"), node("c")], POOL, "a"),
        ([node("a", N), node("b", load=9)], None, "b"),
        ([node("a", unschedulable=True), node("b", load=5)], None, "b"),
        ([node("a", capacity=2, load=2), node("b", load=9)], None, "b"),
        ([node("a", capacity=0), node("b", load=3)], None, "b"),
        ([node("a", capacity=4, load=2), node("b", capacity=100, load=10)], None, "b"),
        (
            [node("a", ready_until=NOW), node("b", load=5, ready_until=NOW + timedelta(seconds=1))],
            None,
            "b",
        ),
        ([node("a", pool=0, load=1), node("b", pool=0, load=0)], POOL, "b"),
    ],
    ids=[
        "least_loaded_node_wins_without_a_pool",
        "node_with_fewest_members_of_the_pool_wins_over_a_less_loaded_one",
        "equal_pool_spread_falls_back_to_load",
        "full_tie_goes_to_the_first_name",
        "not_ready_node_is_never_chosen",
        "disabled_node_is_never_chosen",
        "node_at_capacity_is_never_chosen",
        "node_without_reported_capacity_is_never_chosen",
        "load_is_relative_to_capacity",
        "node_whose_lease_ran_out_at_now_is_not_ready",
        "other_pools_members_do_not_count_as_this_pools",
    ],
)
def test_choose_node_places_sandbox(nodes: list[NodeSlot], pool: str | None, expected: str) -> None:
    choice = choose_node(SandboxRequest("ns/sb", pool), nodes, NOW)
    assert choice.node == expected
    assert choice.placed and choice.reason is None


@pytest.mark.parametrize(
    ("nodes", "reason", "message"),
    [
        ([], Unschedulable.NO_NODES, "0/0 nodes are available: no SandboxNode exists"),
        (
            [node("a", unschedulable=True), node("b", unschedulable=True)],
            Unschedulable.ALL_DISABLED,
            "0/2 nodes are available: 2 Disabled",
        ),
        (
            [node("a", N), node("b", unschedulable=True)],
            Unschedulable.NO_READY_NODE,
            "0/2 nodes are available: 1 NotReady, 1 Disabled",
        ),
        (
            [node("a", N), node("b", N)],
            Unschedulable.NO_READY_NODE,
            "0/2 nodes are available: 2 NotReady",
        ),
        (
            [node("a", capacity=2, load=2), node("b", N), node("c", capacity=1, load=1)],
            Unschedulable.ALL_AT_CAPACITY,
            "0/3 nodes are available: 1 NotReady, 2 at capacity",
        ),
        (
            [node("a", capacity=0)],
            Unschedulable.ALL_AT_CAPACITY,
            "0/1 nodes are available: 1 at capacity",
        ),
        (
            [node("a", ready_until=NOW - timedelta(seconds=1))],
            Unschedulable.NO_READY_NODE,
            "0/1 nodes are available: 1 NotReady",
        ),
    ],
    ids=[
        "no_nodes_at_all",
        "every_node_disabled",
        "no_ready_node_among_not_ready_and_disabled",
        "every_node_not_ready",
        "every_ready_node_at_capacity",
        "node_with_zero_capacity_counts_as_full",
        "expired_lease_makes_a_ready_phase_not_ready",
    ],
)
def test_no_fit_says_why(nodes: list[NodeSlot], reason: Unschedulable, message: str) -> None:
    choice = choose_node(SandboxRequest("ns/sb", POOL), nodes, NOW)
    assert choice.node is None and not choice.placed
    assert (choice.reason, choice.message) == (reason, message)


def test_spreading_a_pool_of_six_over_three_nodes_gives_two_each() -> None:
    counts = {"a": 0, "b": 0, "c": 0}
    for i in range(6):
        slots = [node(n, load=c, pool=c) for n, c in counts.items()]
        chosen = choose_node(SandboxRequest(f"ns/web-{i}", POOL), slots, NOW).node
        assert chosen is not None
        counts[chosen] += 1
    assert counts == {"a": 2, "b": 2, "c": 2}
