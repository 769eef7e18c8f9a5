"""Where a sandbox's agent is, as the gateway remembers it (``gateway.placements``):
kept a few seconds on a fake clock, a failure never kept, and forgotten on demand
with its node's agent."""

from __future__ import annotations

import pytest

from sandlot.gateway.placements import CachedPlacements
from sandlot.gateway.server import Refusal
from sandlot.policy.remembered import Remembered


class Cluster:
    """The API server's answers, as ``gateway.server.Backends`` asks for them."""

    def __init__(self) -> None:
        self.nodes = {"ns/sb": "node-1", "ns/other": "node-1"}
        self.agents = {"node-1": ("10.0.0.1", 8444), "node-2": ("10.0.0.2", 8444)}
        self.reads: list[str] = []

    def node_of(self, namespace: str, name: str) -> str:
        self.reads.append(f"sandbox {namespace}/{name}")
        try:
            return self.nodes[f"{namespace}/{name}"]
        except KeyError:
            raise Refusal(404, f'sandbox "{name}" not found') from None

    def agent_of(self, node: str) -> tuple[str, int]:
        self.reads.append(f"agent {node}")
        return self.agents[node]


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def placements(cluster: Cluster, clock: Clock) -> CachedPlacements:
    return CachedPlacements(cluster.node_of, cluster.agent_of, ttl=5.0, clock=clock)


def test_a_sandboxs_node_and_agent_are_read_once_per_ttl() -> None:
    cluster, clock = Cluster(), Clock()
    kept = placements(cluster, clock)
    for _ in range(3):
        assert kept.agent_of(kept.node_of("ns", "sb")) == ("10.0.0.1", 8444)
    assert cluster.reads == ["sandbox ns/sb", "agent node-1"]
    clock.now += 5.0
    kept.agent_of(kept.node_of("ns", "sb"))
    assert cluster.reads[2:] == ["sandbox ns/sb", "agent node-1"]


def test_a_moved_sandbox_is_found_again_once_forgotten() -> None:
    cluster, clock = Cluster(), Clock()
    kept = placements(cluster, clock)
    assert kept.node_of("ns", "sb") == "node-1"
    kept.agent_of("node-1")
    cluster.nodes["ns/sb"] = "node-2"
    cluster.agents["node-1"] = ("10.0.0.9", 8444)
    assert kept.node_of("ns", "sb") == "node-1"  # remembered
    assert kept.forget("ns", "sb") is True
    assert kept.node_of("ns", "sb") == "node-2"
    assert kept.agent_of("node-1") == ("10.0.0.9", 8444)  # its node's agent went too
    assert kept.forget("ns", "nothing-kept") is False


def test_a_failed_read_is_not_kept() -> None:
    cluster, clock = Cluster(), Clock()
    kept = placements(cluster, clock)
    for _ in range(2):
        with pytest.raises(Refusal):
            kept.node_of("ns", "missing")
    assert cluster.reads == ["sandbox ns/missing"] * 2
    assert kept.forget("ns", "missing") is False


def test_past_the_bound_the_oldest_answer_goes_first() -> None:
    remembered: Remembered[str, int] = Remembered(ttl=5.0, max_entries=2)
    for i, key in enumerate("abc"):
        remembered.remember(key, i, asked_at=float(i))
    assert [remembered.answer(k, 2.0) for k in "abc"] == [None, 1, 2]
    assert remembered.forget("b") == 1 and remembered.forget("b") is None
