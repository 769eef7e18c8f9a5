"""Each pool's claimable members, oldest first (``controllers.offered``), kept from the
sandbox cache's changes: what a claim is offered as members come, go and change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sandlot.api.common import API_VERSION
from sandlot.api.timestamps import rfc3339
from sandlot.controllers.offered import OfferedMembers
from sandlot.controllers.sandboxes import SandboxCache

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
POOL = "ns/web"


def member(
    name: str,
    age: int,
    *,
    phase: str = "Running",
    pool: str | None = "web",
    owner: str = "pool-uid-web",
    paused: bool = False,
    version: str = "1",
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "creationTimestamp": rfc3339(T0 - timedelta(seconds=age)),
            "labels": {"sandlot.dev/pool": pool} if pool else {},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "SandboxPool", "name": "web",
                 "uid": owner, "controller": True}
            ],
        },
        "spec": {"image": "registry.example/app:1", "nodeName": "a",
                 **({"operatingMode": "Paused"} if paused else {})},
        "status": {"phase": phase, "ip": "10.0.0.1"},
    }  # fmt: skip


def first(offered: OfferedMembers, skip: tuple[str, ...] = ()) -> str | None:
    rec = offered.first(POOL, "pool-uid-web", skip)
    return rec.name if rec is not None else None


def test_the_oldest_claimable_member_is_offered_and_members_being_taken_are_skipped() -> None:
    cache = SandboxCache()
    offered = OfferedMembers(cache)
    for name, age in (("young", 1), ("old", 30), ("middle", 10)):
        cache.upsert(member(name, age))
    cache.upsert(member("starting", 60, phase="Scheduled"))
    cache.upsert(member("frozen", 50, paused=True))
    cache.upsert(member("stranger", 40, owner="another-uid"))
    assert first(offered) == "old"
    assert first(offered, ("ns/old",)) == "middle"
    assert first(offered, ("ns/old", "ns/middle")) == "young"
    assert first(offered, ("ns/old", "ns/middle", "ns/young")) is None
    assert first(offered) == "old", "skipping a member does not lose it"


def test_a_taken_member_is_no_longer_offered_and_one_becoming_ready_is() -> None:
    cache = SandboxCache()
    offered = OfferedMembers(cache)
    cache.upsert(member("old", 30))
    cache.upsert(member("late", 60, phase="Scheduled"))
    assert first(offered) == "old"
    cache.upsert(member("old", 30, pool=None, version="2"))  # taken: left the pool
    assert first(offered) is None
    cache.upsert(member("late", 60, version="2"))  # now Running
    assert first(offered) == "late"
    cache.upsert(member("late", 60, paused=True, version="3"))
    assert first(offered) is None
    cache.upsert(member("late", 60, version="4"))  # resumed: offered again
    assert first(offered) == "late"


def test_members_already_in_the_cache_are_offered() -> None:
    cache = SandboxCache()
    cache.upsert(member("there", 5))
    assert first(OfferedMembers(cache)) == "there"
