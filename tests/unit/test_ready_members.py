"""Only a Ready member serves (SPEC section 8): a pool member whose readiness probe
has not passed is listed not ready in its EndpointSlice, is not given to a claim,
and does not count as ready or available in a rollout; a member without a probe
is all of these once Running."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.controllers.claims import _candidate
from sandlot.controllers.pools import _member
from sandlot.controllers.routing import PoolRef, desired_slices
from sandlot.controllers.sandboxes import record_of
from sandlot.policy.claims import Candidate, ClaimAction, decide_claim
from sandlot.policy.pools import Member, Rollout, decide_pool, spec_hash

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
POOL = PoolRef("ns", "web", "uid-1", "web", ({"containerPort": 8080},))
PROBE = {"tcpSocket": {"port": 8080}}


def member(name: str, ip: str, *, probe: bool, ready: bool | None) -> dict[str, Any]:
    """A Running member; ``ready``: its Ready condition (None: it has none)."""
    spec: dict[str, Any] = {"image": "busybox", "nodeName": "n1"}
    if probe:
        spec["readinessProbe"] = PROBE
    status: dict[str, Any] = {
        "phase": "Running",
        "ip": ip,
        "startedAt": "2026-01-01T12:00:00Z",
    }
    if ready is not None:
        status["conditions"] = [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "ProbePassed" if ready else "ProbeFailed",
                "lastTransitionTime": "2026-01-01T12:00:30Z",
            }
        ]
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"u-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T12:00:00Z",
            "labels": {"sandlot.dev/pool": "web"},
        },
        "spec": spec,
        "status": status,
    }


CASES = [(False, None, True), (True, None, False), (True, False, False), (True, True, True)]
IDS = ["no-probe", "probed-no-verdict-yet", "probe-failed", "probe-passed"]


@pytest.mark.parametrize(("probe", "recorded", "ready"), CASES, ids=IDS)
def test_the_endpoint_slice_lists_a_running_member_with_its_readiness(
    probe: bool, recorded: bool | None, ready: bool
) -> None:
    rec = record_of(member("a", "10.0.0.2", probe=probe, ready=recorded))
    assert rec.ready is ready
    (slice_,) = desired_slices(POOL, [rec])
    (endpoint,) = slice_["endpoints"]
    assert endpoint["addresses"] == ["10.0.0.2"]
    assert endpoint["conditions"] == {"ready": ready, "serving": ready, "terminating": False}


@pytest.mark.parametrize(("probe", "recorded", "ready"), CASES, ids=IDS)
def test_a_claim_takes_only_a_ready_member(probe: bool, recorded: bool | None, ready: bool) -> None:
    oldest = _candidate(record_of(member("old", "10.0.0.2", probe=probe, ready=recorded)))
    assert oldest.ready is ready
    younger = Candidate("young", "Running", T0 + timedelta(seconds=5), "10.0.0.3", "n1")
    decision = decide_claim({}, None, True, [oldest, younger], "web")
    assert (decision.action, decision.sandbox) == (ClaimAction.BIND, "old" if ready else "young")


def test_a_claim_waits_while_no_member_is_ready() -> None:
    waiting = _candidate(record_of(member("a", "10.0.0.2", probe=True, ready=False)))
    decision = decide_claim({}, None, True, [waiting], "web")
    assert decision.action is ClaimAction.STATUS
    assert decision.status == {"phase": "Pending", "message": "no Ready member in pool web yet"}


def _judged(probe: bool, recorded: bool | None) -> Member:
    body = member("a", "10.0.0.2", probe=probe, ready=recorded)
    return _member(record_of(body), spec_hash(body["spec"]), lambda _node: True)


@pytest.mark.parametrize(("probe", "recorded", "ready"), CASES, ids=IDS)
def test_ready_replicas_count_only_ready_members(
    probe: bool, recorded: bool | None, ready: bool
) -> None:
    decision = decide_pool(1, 5, [_judged(probe, recorded)], now=T0 + timedelta(hours=1))
    assert (decision.plan.running, decision.ready) == (1, 1 if ready else 0)


def test_a_rollout_does_not_delete_an_old_member_while_the_new_one_is_not_ready() -> None:
    old_ready = replace(_judged(False, None), name="old", current=False)
    new_unready = replace(_judged(True, False), name="new")
    later = T0 + timedelta(hours=1)
    rollout = Rollout(max_surge=1, max_unavailable=0)
    held = decide_pool(1, 5, [old_ready, new_unready], rollout=rollout, now=later)
    assert "old" not in held.plan.delete
    new_ready = replace(new_unready, ready=True)
    rolled = decide_pool(1, 5, [old_ready, new_ready], rollout=rollout, now=later)
    assert "old" in rolled.plan.delete


def test_min_ready_seconds_count_from_the_ready_transition_not_the_start() -> None:
    judged = _judged(True, True)  # started 12:00:00, Ready since 12:00:30
    ten = timedelta(seconds=10)
    assert judged.ready_since == T0 + timedelta(seconds=30)
    assert not judged.available(T0 + timedelta(seconds=35), ten)
    assert judged.available(T0 + timedelta(seconds=40), ten)
    assert judged.available_at(ten) == T0 + timedelta(seconds=40)
    assert not replace(judged, ready=False).available(T0 + timedelta(hours=1), ten)
