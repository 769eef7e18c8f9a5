"""The sandbox feed: events from the informer's thread reach the cache on the loop,
in order, in batches, with the informer held back when the loop falls behind."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sandlot.controllers import eventfeed
from sandlot.controllers.eventfeed import EventFeed
from sandlot.controllers.sandboxes import SandboxCache

JOIN = 10.0  # seconds a thread of the test may take to end


def body(name: str, version: str = "1", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase},
    }


class CountingFeed(EventFeed):
    drains = 0

    def _drain(self) -> None:
        self.drains += 1
        super()._drain()


async def settle(feed: EventFeed) -> None:
    """Let the loop run until the feed has nothing queued or scheduled (bounded)."""
    for _ in range(10_000):
        if not feed._queued and not feed._scheduled:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the feed still holds {len(feed._queued)} events")


def test_a_burst_reaches_the_cache_in_order_in_a_few_loop_callbacks() -> None:
    async def main() -> tuple[SandboxCache, CountingFeed, list[str]]:
        cache = SandboxCache()
        seen: list[str] = []
        feed = CountingFeed(cache, asyncio.get_running_loop(), [lambda t, b: seen.append(t)])

        def put() -> None:
            for i in range(600):
                for t, v in (("ADDED", "1"), ("MODIFIED", "2")):
                    feed.on_event(t, body(f"sb{i}", v))

        thread = threading.Thread(target=put)
        thread.start()
        await asyncio.to_thread(thread.join, JOIN)
        await settle(feed)
        return cache, feed, seen

    cache, feed, seen = asyncio.run(main())
    assert len(cache) == 600
    assert {r.resource_version for r in cache} == {"2"}, "an older event overtook a newer one"
    assert seen == ["ADDED", "MODIFIED"] * 600
    assert 1 <= feed.drains <= 1200 // eventfeed.BATCH + 3, f"{feed.drains} loop callbacks"


def put_all(feed: EventFeed, prefix: str, n: int) -> threading.Thread:
    """An informer's thread putting ``n`` events."""

    def put() -> None:
        for i in range(n):
            feed.on_event("ADDED", body(f"{prefix}{i}"))

    thread = threading.Thread(target=put)
    thread.start()
    return thread


async def settle_until(done: Any, what: str) -> None:
    for _ in range(100_000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


def test_the_informer_waits_while_the_loop_is_behind_then_goes_on() -> None:
    async def main() -> tuple[bool, int, int]:
        cache = SandboxCache()
        feed = EventFeed(cache, asyncio.get_running_loop(), max_queued=4)
        thread = put_all(feed, "sb", 10)
        thread.join(0.5)  # the loop is not running meanwhile: nothing drains
        held_back, queued = thread.is_alive(), len(feed._queued)
        await settle_until(lambda: not thread.is_alive(), "the informer's thread ended")
        await settle(feed)
        return held_back, queued, len(cache)

    held_back, queued, held = asyncio.run(main())
    assert held_back and queued == 4, "the informer ran ahead of the loop without bound"
    assert held == 10


def test_close_releases_an_informer_waiting_for_room_and_drops_the_rest() -> None:
    async def main() -> tuple[bool, int]:
        cache = SandboxCache()
        feed = EventFeed(cache, asyncio.get_running_loop(), max_queued=2)
        thread = put_all(feed, "sb", 10)
        thread.join(0.5)  # the loop is not running meanwhile: nothing drains
        assert thread.is_alive(), "the informer was not held back"
        feed.close()
        thread.join(JOIN)
        await settle(feed)
        return thread.is_alive(), len(cache)

    alive, held = asyncio.run(main())
    assert not alive, "close() did not release an informer waiting for room"
    assert held == 0, "events queued before close() reached the cache after it"


def test_a_complete_list_drops_what_it_did_not_hold_but_not_an_answer_in_flight() -> None:
    async def main() -> SandboxCache:
        cache = SandboxCache()
        feed = EventFeed(cache, asyncio.get_running_loop())
        for name in ("a", "b", "c"):
            feed.on_event("SYNC", body(name))
        await settle(feed)
        cache.upsert(body("d", "9"))  # created by this operator after the list was taken
        feed.on_listed({"ns/a", "ns/c"})
        await settle(feed)
        return cache

    cache = asyncio.run(main())
    assert sorted(r.name for r in cache) == ["a", "c", "d"]
    assert cache.node_load["n1"] == 3


def test_the_cache_is_synced_only_once_its_first_list_is_taken_in_whole() -> None:
    seen_then: list[int] = []

    async def main() -> tuple[SandboxCache, list[bool]]:
        cache = SandboxCache()
        cache.on_synced.append(lambda: seen_then.append(len(cache)))
        feed = EventFeed(cache, asyncio.get_running_loop(), max_queued=4)
        synced_midway = []
        for name in ("a", "b", "c"):
            feed.on_event("SYNC", body(name))
        await settle(feed)
        synced_midway.append(cache.synced)
        feed.on_listed({"ns/a", "ns/b", "ns/c"})
        await settle(feed)
        feed.on_listed({"ns/a"})  # a later re-list: already synced, not announced again
        await settle(feed)
        return cache, synced_midway

    cache, synced_midway = asyncio.run(main())
    assert synced_midway == [False], "a part of the first list counted as the fleet"
    assert cache.synced
    assert seen_then == [3], "the sync was announced before every listed sandbox was in"
