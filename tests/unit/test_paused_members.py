"""A paused pool member serves nobody: it leaves its pool's EndpointSlice, is not
given to a claim, does not count as available in a rollout, and pausing it is not a
template change that would make the pool replace it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.controllers.routing import PoolRef, desired_slices
from sandlot.controllers.sandboxes import record_of
from sandlot.policy.claims import Candidate, ClaimAction, decide_claim
from sandlot.policy.pools import spec_hash

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
POOL = PoolRef("ns", "web", "uid-1", "web", ({"containerPort": 8080},))
TEMPLATE = {"image": "busybox", "command": ["httpd"], "operatingMode": "Running"}


def member(name: str, ip: str, mode: str) -> dict[str, object]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"u-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T12:00:00Z",
            "labels": {"sandlot.dev/pool": "web"},
        },
        "spec": {**TEMPLATE, "nodeName": "n1", "operatingMode": mode},
        "status": {"phase": "Running", "ip": ip},
    }


def test_a_paused_member_leaves_the_endpoint_slice() -> None:
    records = [
        record_of(member("a", "10.0.0.2", "Running")),
        record_of(member("b", "10.0.0.3", "Paused")),
    ]
    assert [r.paused for r in records] == [False, True]
    (slice_,) = desired_slices(POOL, records)
    assert [e["addresses"] for e in slice_["endpoints"]] == [["10.0.0.2"]]


@pytest.mark.parametrize(
    ("paused", "bound"), [(False, "old"), (True, "young")], ids=["running", "paused"]
)
def test_a_claim_is_never_given_a_paused_member(paused: bool, bound: str) -> None:
    members = [
        Candidate("old", "Running", T0, "10.0.0.2", "n1", paused=paused),
        Candidate("young", "Running", T0 + timedelta(seconds=5), "10.0.0.3", "n1"),
    ]
    decision = decide_claim({}, None, True, members, "web")
    assert (decision.action, decision.sandbox) == (ClaimAction.BIND, bound)


def test_pausing_a_member_is_not_a_template_change() -> None:
    running, paused = (member("a", "10.0.0.2", m)["spec"] for m in ("Running", "Paused"))
    assert spec_hash(paused) == spec_hash(running) == spec_hash(TEMPLATE)  # type: ignore[arg-type]
    assert spec_hash({**TEMPLATE, "image": "other"}) != spec_hash(TEMPLATE)
