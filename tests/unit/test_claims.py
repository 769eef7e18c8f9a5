"""SandboxClaims: the pure decision (table), and the controller binding a claim to a
warm pool member over the fake API, with the pool replacing what it gave away."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.api.common import API_VERSION
from sandlot.api.timestamps import rfc3339
from sandlot.controllers.claims import (
    BURST_HOLD_LIMIT,
    CLAIM_WORKERS,
    POOL_HOLD_LIMIT,
    ClaimController,
)
from sandlot.policy.claims import (
    Candidate,
    ClaimAction,
    ClaimDecision,
    ClaimEnd,
    ClaimLifecycle,
    EndAction,
    decide_claim,
    decide_claim_end,
    hold_replacements,
)
from tests.support.workloads import Taken, WorkloadWorld

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def c(name: str, phase: str = "Running", age: int = 0, ip: str | None = "10.0.0.1") -> Candidate:
    return Candidate(name, phase, T0 + timedelta(seconds=age), ip, "n1")


ROWS: dict[str, tuple[dict[str, Any], Candidate | None, bool, list[Candidate], ClaimDecision]] = {
    "binds_the_member_warm_longest": (
        {},
        None,
        True,
        [c("young", age=9), c("old", age=1), c("pending", "Pending", age=0)],
        ClaimDecision(ClaimAction.BIND, sandbox="old"),
    ),
    "waits_without_a_running_member": (
        {},
        None,
        True,
        [c("p", "Scheduled")],
        ClaimDecision(
            ClaimAction.STATUS,
            status={"phase": "Pending", "message": "no Ready member in pool web yet"},
        ),
    ),
    "says_so_when_the_pool_is_missing": (
        {"phase": "Pending"},
        None,
        False,
        [],
        ClaimDecision(
            ClaimAction.STATUS, status={"phase": "Pending", "message": "pool web does not exist"}
        ),
    ),
    "a_bound_claim_writes_its_status_once": (
        {},
        c("old"),
        True,
        [],
        ClaimDecision(
            ClaimAction.STATUS,
            status={
                "phase": "Bound",
                "sandboxName": "old",
                "address": "10.0.0.1",
                "nodeName": "n1",
            },
        ),
    ),
    "then_nothing": (
        {"phase": "Bound", "sandboxName": "old", "address": "10.0.0.1", "nodeName": "n1"},
        c("old"),
        True,
        [c("other")],
        ClaimDecision(ClaimAction.NONE),
    ),
    "its_sandbox_ended_is_lost_not_rebound": (
        {"phase": "Bound", "sandboxName": "old"},
        c("old", "Dead"),
        True,
        [c("other")],
        ClaimDecision(
            ClaimAction.STATUS,
            status={"phase": "Lost", "sandboxName": "old", "message": "sandbox old ended Dead"},
        ),
    ),
    "its_sandbox_deleted_is_lost": (
        {"phase": "Bound", "sandboxName": "old"},
        None,
        True,
        [c("other")],
        ClaimDecision(
            ClaimAction.STATUS, status={"phase": "Lost", "message": "sandbox old was deleted"}
        ),
    ),
}


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_decide_claim(row: tuple[Any, ...]) -> None:
    status, bound, exists, members, expected = row
    assert decide_claim(status, bound, exists, members, "web") == expected


class ClaimWorld(WorkloadWorld):
    def __init__(self) -> None:
        super().__init__()
        self.claims = ClaimController(
            self.objects,  # type: ignore[arg-type]
            self.cache,
            self.pools,
            is_leader=lambda: self.leader,
            clock=self.clock.now,
            queue_clock=self.clock.monotonic,
            metrics=self.metrics,
        )

    def claim(self, name: str, pool: str, namespace: str = "ns", **spec: Any) -> str:
        body = {
            "apiVersion": API_VERSION,
            "kind": "SandboxClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"claim-uid-{name}",
                "resourceVersion": "c1",
                "creationTimestamp": rfc3339(self.clock.now()),
            },
            "spec": {"poolName": pool, **spec},
            "status": {},
        }
        self.objects.claims[f"{namespace}/{name}"] = body
        self.claims.on_claim(None, copy.deepcopy(body))
        return f"{namespace}/{name}"

    def run_members(self) -> None:
        for body in self.objects.sandboxes.values():
            if body["status"].get("phase") == "Scheduled":
                body["status"].update(phase="Running", ip="10.0.0.7")
                self.objects.touch(body)

    def step(self) -> Taken:
        taken = Taken()
        for _ in range(5):
            taken += super().step()
            taken.claims += asyncio.run(self.claims.queue.run_until_idle())
        taken += super().step()
        return taken


def test_a_claim_is_bound_to_a_running_member_which_leaves_the_pool_and_is_replaced() -> None:
    w = ClaimWorld()
    w.node("a", capacity=10)
    pool = w.pool("web", replicas=2)
    w.step()
    w.run_members()
    w.step()
    before = set(w.members(pool))

    claim = w.claim("mine", "web")
    w.step()
    status = w.objects.claims[claim]["status"]
    assert status["phase"] == "Bound" and status["address"] == "10.0.0.7", status
    taken = f"ns/{status['sandboxName']}"
    assert taken in before
    meta = w.objects.sandboxes[taken]["metadata"]
    assert "sandlot.dev/pool" not in meta["labels"]
    assert meta["labels"]["sandlot.dev/claim"] == "mine"
    assert meta["labels"]["sandlot.dev/claimed-from"] == "web"
    assert meta["annotations"]["sandlot.dev/claimed-at"] == status["boundAt"]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": API_VERSION,
            "kind": "SandboxClaim",
            "name": "mine",
            "uid": "claim-uid-mine",
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    assert taken not in w.members(pool)
    assert len(w.members(pool)) == 2, "the pool replaced the member it gave away"


def test_a_claim_waits_for_a_running_member_and_is_woken_by_it() -> None:
    w = ClaimWorld()
    w.node("a", capacity=10)
    w.pool("web", replicas=1)
    claim = w.claim("mine", "web")
    w.step()
    assert w.objects.claims[claim]["status"]["phase"] == "Pending"
    w.run_members()
    w.step()
    assert w.objects.claims[claim]["status"]["phase"] == "Bound"


def test_two_claims_never_share_a_member_and_deleting_one_deletes_its_sandbox() -> None:
    w = ClaimWorld()
    w.node("a", capacity=10)
    w.pool("web", replicas=2)
    w.step()
    w.run_members()
    w.step()
    first, second = w.claim("one", "web"), w.claim("two", "web")
    w.step()
    names = {w.objects.claims[k]["status"]["sandboxName"] for k in (first, second)}
    assert len(names) == 2

    gone = f"ns/{w.objects.claims[first]['status']['sandboxName']}"
    body = w.objects.claims.pop(first)
    w.claims.on_claim("DELETED", copy.deepcopy(body))
    w.step()
    assert gone not in w.objects.sandboxes


class GatedStatus:
    """Holds the claim's status write at the fake API until the test lets it go."""

    def __init__(self, world: ClaimWorld) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.write = world.objects.patch_claim_status

        def gated(namespace: str, name: str, status: Any) -> dict[str, Any] | None:
            self.entered.set()
            assert self.release.wait(5), "the test never let the status write go"
            return self.write(namespace, name, status)

        world.objects.patch_claim_status = gated  # type: ignore[method-assign]


def warm_world(replicas: int = 2) -> tuple[ClaimWorld, str]:
    w = ClaimWorld()
    w.node("a", capacity=max(10, replicas))
    pool = w.pool("web", replicas=replicas)
    w.step()
    w.run_members()
    w.step()
    return w, pool


def test_the_pool_replaces_a_claimed_member_only_after_the_claims_status_is_written() -> None:
    w, pool = warm_world()
    gate = GatedStatus(w)
    warmed = len(w.objects.writes)

    def since() -> list[str]:
        return [verb for verb, _ in w.objects.writes[warmed:]]

    async def scenario() -> None:
        claim = w.claim("mine", "web")
        binding = asyncio.create_task(w.claims.queue.run_until_idle())
        assert await asyncio.to_thread(gate.entered.wait, 5), "the claim never took a member"
        w._deliver()  # the take's watch event: the member left the pool
        assert len(w.members(pool)) == 1
        assert await w.pools.queue.run_until_idle() == [], "the pool waits for the claim"
        assert since() == ["take"]
        gate.release.set()
        await asyncio.wait_for(binding, timeout=5)
        assert w.objects.claims[claim]["status"]["phase"] == "Bound"
        await w.pools.queue.run_until_idle()

    asyncio.run(scenario())
    assert since()[:3] == ["take", "patch-claim-status", "create"], since()
    assert len(w.members(pool)) == 2, "the pool replaced the member it gave away"


def test_a_claim_stuck_writing_its_status_holds_its_pool_back_no_longer_than_the_limit() -> None:
    w, _ = warm_world()
    gate = GatedStatus(w)
    warmed = len(w.objects.writes)

    async def scenario() -> None:
        w.claim("mine", "web")
        binding = asyncio.create_task(w.claims.queue.run_until_idle())
        assert await asyncio.to_thread(gate.entered.wait, 5), "the claim never took a member"
        w._deliver()
        w.clock.advance(POOL_HOLD_LIMIT)
        assert await w.pools.queue.run_until_idle() == [], "the unbound claim holds it on"
        w.clock.advance(BURST_HOLD_LIMIT - POOL_HOLD_LIMIT)
        await w.pools.queue.run_until_idle()
        created = [verb for verb, _ in w.objects.writes[warmed:] if verb == "create"]
        assert created == ["create"], "released at the limit, before the claim's status"
        gate.release.set()
        await asyncio.wait_for(binding, timeout=5)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("unbound", "starved", "held"), [(0, 0, False), (3, 0, True), (3, 1, False), (0, 1, False)]
)
def test_hold_replacements(unbound: int, starved: int, held: bool) -> None:
    assert hold_replacements(unbound, starved) is held


def test_a_burst_of_claims_binds_first_and_its_pool_replaces_after_the_last() -> None:
    w, pool = warm_world(replicas=3)
    warmed = len(w.objects.writes)

    async def scenario() -> None:
        w.claim("one", "web")
        w.claim("two", "web")
        w.pools.queue.add(pool)  # any event of the pool's meanwhile
        assert await w.pools.queue.run_until_idle() == [], "held while claims are unbound"
        assert set(await w.claims.queue.run_until_idle()) == {"ns/one", "ns/two"}
        w._deliver()
        assert pool in await w.pools.queue.run_until_idle(), "released by the last bind"

    asyncio.run(scenario())
    verbs = [verb for verb, _ in w.objects.writes[warmed:]]
    assert verbs[:4] == ["take", "patch-claim-status"] * 2, verbs
    assert verbs.count("create") == 2 and verbs.index("create") > 3, verbs
    assert not w.pools.queue.is_held(pool)


def test_a_claim_finding_no_member_lets_its_pool_grow_at_once() -> None:
    w, pool = warm_world(replicas=1)
    warmed = len(w.objects.writes)

    async def scenario() -> None:
        w.claim("one", "web")
        w.claim("two", "web")
        assert w.pools.queue.is_held(pool)
        await w.claims.queue.run_until_idle()
        assert not w.pools.queue.is_held(pool), "claim two is starved: nothing may wait"
        w._deliver()
        assert pool in await w.pools.queue.run_until_idle()

    asyncio.run(scenario())
    assert w.objects.claims["ns/two"]["status"]["phase"] == "Pending"
    assert "create" in [verb for verb, _ in w.objects.writes[warmed:]]


def test_a_burst_holds_its_pool_no_longer_than_the_limit_and_not_again_until_drained() -> None:
    w, pool = warm_world(replicas=3)

    async def scenario() -> None:
        w.claim("one", "web")
        w.pools.queue.add(pool)
        assert await w.pools.queue.run_until_idle() == []
        w.clock.advance(BURST_HOLD_LIMIT)
        assert await w.pools.queue.run_until_idle() == [pool], "released at the limit"
        w.claim("two", "web")  # the same burst goes on: no new hold
        assert not w.pools.queue.is_held(pool)
        await w.claims.queue.run_until_idle()
        w.claim("three", "web")  # drained in between: a new burst holds again
        assert w.pools.queue.is_held(pool)

    asyncio.run(scenario())


def test_a_claim_deleted_while_it_is_being_bound_gives_its_sandbox_back_deleted() -> None:
    w, pool = warm_world()
    gate = GatedStatus(w)

    async def scenario() -> str:
        claim = w.claim("mine", "web")
        binding = asyncio.create_task(w.claims.queue.run_until_idle())
        assert await asyncio.to_thread(gate.entered.wait, 5), "the claim never took a member"
        taken = next(
            k
            for k, b in w.objects.sandboxes.items()
            if b["metadata"]["labels"].get("sandlot.dev/claim") == "mine"
        )
        body = w.objects.claims.pop(claim)
        w.claims.on_claim("DELETED", copy.deepcopy(body))
        gate.release.set()
        await asyncio.wait_for(binding, timeout=5)
        return taken

    taken = asyncio.run(scenario())
    w.step()
    assert taken not in w.objects.sandboxes, "the sandbox of a claim deleted mid-bind is deleted"
    assert len(w.members(pool)) == 2


def test_a_claims_wait_and_its_pools_depth_are_measured() -> None:
    """The two figures an autoscaler of a pool scales on: the members waiting for a
    claim, and how long claims wait for one."""
    w = ClaimWorld()
    w.node("a", capacity=10)
    w.pool("web", replicas=2)
    w.step()
    depth = w.metrics.pool_ready_members.labels("ns", "web")
    assert depth._value.get() == 0  # Scheduled, not Running yet
    claim = w.claim("mine", "web")
    w.step()
    assert w.objects.claims[claim]["status"].get("phase") != "Bound"
    w.clock.advance(3)
    w.run_members()
    w.step()
    assert w.objects.claims[claim]["status"]["phase"] == "Bound"
    waited = w.metrics.claim_wait_seconds
    assert waited._sum.get() == pytest.approx(3.0)  # the fake clock: exactly the wait
    assert depth._value.get() == 1, "one member left waiting (its replacement not Running)"


AT = T0 + timedelta(seconds=30)
RETAIN = ClaimLifecycle(shutdown_time=AT)
DELETE = ClaimLifecycle(shutdown_time=AT, delete=True)
TTL = ClaimLifecycle(ttl_seconds=20)


@pytest.mark.parametrize(
    ("phase", "lifecycle", "finished", "now", "expected"),
    [
        ("Bound", ClaimLifecycle(), None, T0, ClaimEnd(EndAction.NONE)),
        ("Bound", RETAIN, None, T0, ClaimEnd(EndAction.NONE, 30.0)),
        (
            "Bound",
            RETAIN,
            None,
            AT,
            ClaimEnd(
                EndAction.EXPIRE, None, "claim ended at its shutdownTime 2026-01-01T12:00:30Z"
            ),
        ),
        (
            "Pending",
            DELETE,
            None,
            AT + timedelta(hours=1),
            ClaimEnd(
                EndAction.DELETE, None, "claim ended at its shutdownTime 2026-01-01T12:00:30Z"
            ),
        ),
        ("Expired", RETAIN, T0, AT + timedelta(hours=1), ClaimEnd(EndAction.NONE)),
        ("Lost", TTL, None, T0, ClaimEnd(EndAction.STAMP)),
        ("Lost", TTL, T0, T0 + timedelta(seconds=5), ClaimEnd(EndAction.NONE, 15.0)),
        (
            "Expired",
            TTL,
            T0,
            T0 + timedelta(seconds=20),
            ClaimEnd(
                EndAction.DELETE,
                None,
                "Expired at 2026-01-01T12:00:00Z, ttlSecondsAfterFinished 20 is over",
            ),
        ),
        ("Bound", TTL, None, T0 + timedelta(days=1), ClaimEnd(EndAction.NONE)),
    ],
    ids=[
        "no_lifecycle",
        "waits_for_its_shutdown_time",
        "retain_expires_at_the_second",
        "delete_deletes_even_a_pending_claim",
        "expired_without_ttl_stays",
        "lost_without_finished_at_stamps_it",
        "lost_waits_out_its_ttl",
        "expired_past_its_ttl_is_deleted",
        "ttl_does_not_touch_a_bound_claim",
    ],
)
def test_decide_claim_end(
    phase: str,
    lifecycle: ClaimLifecycle,
    finished: datetime | None,
    now: datetime,
    expected: ClaimEnd,
) -> None:
    assert decide_claim_end(phase, lifecycle, finished, now) == expected


def test_an_expired_claim_is_not_rebound_nor_marked_lost() -> None:
    status = {"phase": "Expired", "sandboxName": "web-1"}
    assert decide_claim(status, c("web-1", "Stopped"), True, [c("web-2")], "web") == ClaimDecision(
        ClaimAction.NONE
    )


def bound_world(**spec: Any) -> tuple[ClaimWorld, str, str]:
    w, _ = warm_world()
    claim = w.claim("mine", "web", **spec)
    w.step()
    status = w.objects.claims[claim]["status"]
    assert status["phase"] == "Bound", status
    return w, claim, f"ns/{status['sandboxName']}"


def test_retain_stops_the_sandbox_claim_expired_and_the_claim_becomes_expired() -> None:
    w, claim, sandbox = bound_world(
        lifecycle={"shutdownTime": rfc3339(w_at := T0 + timedelta(hours=2))}
    )
    wait = (w_at - w.clock.now()).total_seconds()
    assert w.claims.queue.due_at(claim) == pytest.approx(w.clock.monotonic() + wait)
    w.clock.advance(wait - 0.001)
    w.step()
    assert w.objects.claims[claim]["status"]["phase"] == "Bound", "not a moment early"
    w.clock.advance(0.001)
    w.step()
    status = w.objects.claims[claim]["status"]
    assert status["phase"] == "Expired" and status["finishedAt"] == rfc3339(w_at), status
    stopped = w.objects.sandboxes[sandbox]["status"]
    assert (stopped["phase"], stopped["reason"]) == ("Stopped", "ClaimExpired")
    w.step()
    assert w.objects.claims[claim]["status"]["phase"] == "Expired", "final, not Lost"


def test_delete_policy_deletes_the_claim_and_its_sandbox_at_shutdown_time() -> None:
    w, claim, sandbox = bound_world(
        lifecycle={"shutdownTime": rfc3339(T0 + timedelta(hours=2)), "shutdownPolicy": "Delete"}
    )
    w.clock.advance((T0 + timedelta(hours=2) - w.clock.now()).total_seconds())
    w.step()
    assert claim not in w.objects.claims
    assert sandbox not in w.objects.sandboxes


def test_a_lost_claim_is_deleted_with_its_sandbox_after_its_ttl() -> None:
    w, claim, sandbox = bound_world(lifecycle={"ttlSecondsAfterFinished": 60})
    w.objects.sandboxes[sandbox]["status"].update(phase="Failed", reason="Crashed")
    w.objects.touch(w.objects.sandboxes[sandbox])
    w.step()
    status = w.objects.claims[claim]["status"]
    assert status["phase"] == "Lost" and status["finishedAt"] == rfc3339(w.clock.now()), status
    w.claims.on_claim("MODIFIED", copy.deepcopy(w.objects.claims[claim]))  # its watch event
    w.step()
    assert w.claims.queue.due_at(claim) == w.clock.monotonic() + 60
    w.clock.advance(59.999)
    w.step()
    assert claim in w.objects.claims, "not a moment early"
    w.clock.advance(0.001)
    w.step()
    assert claim not in w.objects.claims
    assert sandbox not in w.objects.sandboxes


def test_claims_bound_at_once_never_take_the_same_member() -> None:
    """Every take is held at the fake API until ``CLAIM_WORKERS`` of them are in
    flight together, so the claims are decided concurrently for certain: each must
    have chosen a different member (one take per member, none lost to another
    claim), and every claim ends bound to its own."""
    w, _ = warm_world(replicas=CLAIM_WORKERS + 4)
    keys = [w.claim(f"c{i}", "web") for i in range(CLAIM_WORKERS)]
    together = threading.Barrier(CLAIM_WORKERS)
    take = w.objects.take_sandbox

    def held_take(
        namespace: str, name: str, resource_version: str, metadata: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        if not together.broken:
            with contextlib.suppress(threading.BrokenBarrierError):
                together.wait(timeout=20)  # broken: checked after the run
        return take(namespace, name, resource_version, metadata)

    w.objects.take_sandbox = held_take  # type: ignore[method-assign]

    async def scenario() -> None:
        binding = asyncio.create_task(w.claims.run())
        try:
            for _ in range(600):
                statuses = [w.objects.claims[k]["status"] for k in keys]
                if all(s.get("phase") == "Bound" for s in statuses):
                    return
                await asyncio.sleep(0.05)
            takes = sorted(key for verb, key in w.objects.writes if verb == "take")
            raise AssertionError(f"claims not all bound in 30 s; takes sent: {takes}")
        finally:
            binding.cancel()
            await asyncio.gather(binding, return_exceptions=True)

    asyncio.run(scenario())
    assert not together.broken, f"the takes were not in flight {CLAIM_WORKERS} at once"
    takes = [key for verb, key in w.objects.writes if verb == "take"]
    assert len(takes) == len(set(takes)) == CLAIM_WORKERS, f"a lost race: {sorted(takes)}"
    names = {w.objects.claims[k]["status"]["sandboxName"] for k in keys}
    assert len(names) == CLAIM_WORKERS


def test_a_claim_deleted_while_no_watch_was_there_is_let_go_by_the_next_list() -> None:
    w, _ = warm_world()
    synced: list[bool] = []
    w.claims.on_synced.append(lambda: synced.append(w.claims.synced))
    claim = w.claim("mine", "web")
    w.step()
    taken = f"ns/{w.objects.claims[claim]['status']['sandboxName']}"
    w.claims.retain({claim})
    assert synced == [True] and taken in w.objects.sandboxes, "listed: kept"
    del w.objects.claims[claim]
    w.claims.retain(set())  # a relist without it: it was deleted meanwhile
    w.step()
    assert taken not in w.objects.sandboxes, "its sandbox goes with it, as on DELETED"
    assert synced == [True], "synced once"
