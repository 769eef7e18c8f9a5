"""Only a Ready member serves (SPEC section 8): a pool member whose readiness probe
has not passed is listed not ready in its EndpointSlice, is not given to a claim,
and does not count as ready or available in a rollout; a member without a probe
is all of these once Running."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.timestamps import rfc3339
from sandlot.controllers.claims import _candidate
from sandlot.controllers.pools import _member
from sandlot.controllers.routing import PoolRef, desired_slices
from sandlot.controllers.sandboxes import SandboxCache, record_of
from sandlot.policy.claims import Candidate, ClaimAction, decide_claim
from sandlot.policy.pools import Member, Rollout, decide_pool, spec_hash
from tests.support.clock import FakeClock
from tests.support.workloads import WorkloadWorld

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


# minReadySeconds is judged on the operator's clock (SPEC section 8: a decision never
# compares one machine's clock with another's): from when the operator first saw the
# member Ready, whatever time the node's clock wrote on its condition or its start.
SKEWS = [timedelta(hours=3), timedelta(hours=-3), timedelta(0)]
SKEW_IDS = ["node-3h-ahead", "node-3h-behind", "node-on-time"]


def skewed(probe: bool, skew: timedelta, now: datetime, name: str = "a") -> dict[str, Any]:
    """A Ready member whose agent stamped its start and Ready condition at ``now`` on
    a node clock ``skew`` off."""
    body = member(name, "10.0.0.2", probe=probe, ready=True if probe else None)
    stamp = rfc3339(now + skew)
    body["status"]["startedAt"] = stamp
    for c in body["status"].get("conditions") or []:
        c["lastTransitionTime"] = stamp
    return body


@pytest.mark.parametrize("probe", [True, False], ids=["probed", "no-probe"])
@pytest.mark.parametrize("skew", SKEWS, ids=SKEW_IDS)
def test_min_ready_seconds_count_from_when_the_operator_saw_it_ready(
    skew: timedelta, probe: bool
) -> None:
    clock = FakeClock(T0)
    cache = SandboxCache(wall=clock.now)
    body = skewed(probe, skew, T0)
    cache.on_event(None, body)
    clock.advance(5)
    later = copy.deepcopy(body)  # another change of the same Ready episode
    later["metadata"]["resourceVersion"] = "2"
    cache.on_event("MODIFIED", later)
    rec = cache.get("ns/a")
    assert rec is not None and rec.ready_since == T0, "the same episode's moment moved"
    judged = _member(rec, spec_hash(body["spec"]), lambda _node: True)
    ten = timedelta(seconds=10)
    assert not judged.available(T0 + timedelta(seconds=9), ten)
    assert judged.available(T0 + ten, ten)
    assert judged.available_at(ten) == T0 + ten


def test_a_member_ready_again_counts_from_its_new_episode() -> None:
    clock = FakeClock(T0)
    cache = SandboxCache(wall=clock.now)
    body = member("a", "10.0.0.2", probe=True, ready=True)
    cache.on_event(None, body)
    clock.advance(60)
    again = copy.deepcopy(body)  # it flapped; the cache saw only the new transition
    again["metadata"]["resourceVersion"] = "3"
    again["status"]["conditions"][0]["lastTransitionTime"] = "2026-01-01T12:00:50Z"
    cache.on_event("MODIFIED", again)
    rec = cache.get("ns/a")
    assert rec is not None and rec.ready_since == T0 + timedelta(seconds=60)


def rollout_world(skew: timedelta) -> tuple[WorkloadWorld, str, str]:
    """Replicas 1, maxSurge 1, maxUnavailable 0, minReadySeconds 10: one old member
    available for long, and its replacement started (at the operator's now) by an
    agent whose clock is ``skew`` off."""
    w = WorkloadWorld()
    w.node("a", capacity=10)
    strategy = {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pool = w.pool("web", replicas=1, minReadySeconds=10, strategy=strategy)
    w.step()
    (old,) = w.members(pool)
    started(w, old, skew)
    w.clock.advance(60)
    w.renew("a")
    w.step()
    body = w.objects.pools[pool]
    body["spec"]["template"]["spec"]["image"] = "registry.example/app:2"
    body["metadata"]["generation"] += 1
    w.objects.touch(body)
    w.pools.on_pool("MODIFIED", copy.deepcopy(body))
    w.step()
    (new,) = (k for k in w.members(pool) if k != old)
    started(w, new, skew)
    w.step()
    return w, old, new


def started(w: WorkloadWorld, key: str, skew: timedelta) -> None:
    status = w.objects.sandboxes[key]["status"]
    status.update(phase="Running", ip="10.0.0.9", startedAt=rfc3339(w.clock.now() + skew))
    w.objects.touch(w.objects.sandboxes[key])


@pytest.mark.parametrize("skew", SKEWS, ids=SKEW_IDS)
def test_a_rollout_waits_min_ready_seconds_on_the_operators_clock(skew: timedelta) -> None:
    w, old, new = rollout_world(skew)
    w.clock.advance(9)
    w.renew("a")
    w.step()
    assert old in w.objects.sandboxes, "the old member went before its replacement was available"
    w.clock.advance(1)
    w.renew("a")
    w.step()
    assert old not in w.objects.sandboxes, "the old member stayed once its replacement counted"
    assert new in w.objects.sandboxes


def test_an_old_member_that_serves_is_kept_while_its_min_ready_is_counted() -> None:
    """An operator that just started (or took over) first sees every member Ready
    now: none is available for minReadySeconds yet, and an old member that serves
    is not deleted for that; one that serves nobody still goes."""
    ten = timedelta(seconds=10)
    old = Member("old", "Running", True, T0 - timedelta(hours=1), current=False, ready_since=T0)
    new = Member("new", "Running", True, T0 - timedelta(minutes=5), ready_since=T0)
    rollout = Rollout(max_surge=1, max_unavailable=0)
    kept = decide_pool(1, 5, [old, new], rollout=rollout, now=T0, min_ready=ten)
    assert "old" not in kept.plan.delete
    gone = decide_pool(1, 5, [replace(old, ready=False), new], rollout=rollout, now=T0,
                       min_ready=ten)  # fmt: skip
    assert "old" in gone.plan.delete
    later = decide_pool(1, 5, [old, new], rollout=rollout, now=T0 + ten, min_ready=ten)
    assert "old" in later.plan.delete
