"""The recovery bench's judgement of when its pools are settled, the state the
restart is measured from: a Service counting a member its claim just took is not
settled, since that member leaves the Service right after, kill or no kill."""

from __future__ import annotations

from typing import Any

import pytest
from bench.recovery import POOLS, REPLICAS, settled

from sandlot.api.keys import POOL_LABEL


def member(pool: str, name: str, phase: str | None = "Running") -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "labels": {POOL_LABEL: pool}}}
    if phase is not None:
        body["status"] = {"phase": phase}
    return body


def full_pools() -> tuple[list[dict[str, Any]], dict[str, set[str]]]:
    members = [member(f"p{i}", f"p{i}-{j}") for i in range(POOLS) for j in range(REPLICAS)]
    routed = {f"svc-p{i}": {f"p{i}-{j}" for j in range(REPLICAS)} for i in range(POOLS)}
    return members, routed


def bound(**claims: str) -> dict[str, dict[str, Any]]:
    return {c: {"phase": "Bound", "sandboxName": s} for c, s in claims.items()}


def test_every_service_routing_exactly_its_pools_running_members_is_settled() -> None:
    members, routed = full_pools()
    assert settled(members, routed, {})


def test_a_replacement_running_and_routed_after_the_claims_is_settled() -> None:
    members, routed = full_pools()
    members = [m for m in members if m["metadata"]["name"] != "p0-0"] + [member("p0", "p0-new")]
    routed["svc-p0"] = (routed["svc-p0"] - {"p0-0"}) | {"p0-new"}
    assert settled(members, routed, bound(c0="p0-0"))


def test_a_claim_bound_before_its_pool_took_the_member_out_of_the_service_is_not_settled() -> None:
    # As read between the claim's status write and its pool's next pass: the member
    # has left the pool (its label is the claim's now) and its replacement is not
    # there yet, but the Service still counts it among four ready endpoints.
    members, routed = full_pools()
    members = [m for m in members if m["metadata"]["name"] != "p0-0"]
    assert len(routed["svc-p0"]) == REPLICAS
    assert not settled(members, routed, bound(c0="p0-0"))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"svc-p1": {"p1-0", "p1-1", "p1-2"}}, "a Service one member short"),
        ({"svc-p1": {"p1-0", "p1-1", "p1-2", "p1-3", "stranger"}}, "an endpoint of no member"),
    ],
    ids=["short", "stranger"],
)
def test_a_service_not_routing_exactly_the_members_is_not_settled(
    change: dict[str, set[str]], why: str
) -> None:
    members, routed = full_pools()
    assert not settled(members, {**routed, **change}, {}), why


def test_a_claim_not_bound_yet_or_a_member_not_running_is_not_settled() -> None:
    members, routed = full_pools()
    assert not settled(members, routed, {"c0": {"phase": "Pending"}})
    members[0] = member("p0", "p0-0", "Scheduled")
    assert not settled(members, routed, {})
