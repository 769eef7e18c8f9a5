"""Each pool's claimable members, oldest first, kept as the sandbox cache changes.

A claim takes its pool's Ready member that has been warm longest
(``policy.claims.decide_claim``). Finding it by sorting every member on every
claim costs a scan of the pool per claim, which at a thousand members and a
thousand claims is most of the claim path; so each pool keeps a heap of
``(created_at, name)`` fed by the cache's listener. Entries are removed lazily: a
member that stopped being claimable (taken, paused, not Ready, gone) is dropped
when it reaches the top, checked against the cache, which stays the one truth.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from datetime import datetime

from sandlot.api.sandbox import SandboxPhase
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord

Entry = tuple[datetime, str, str]  # (created_at, name, key)


def claimable(rec: SandboxRecord) -> bool:
    """A member a claim may take: Running, Ready and not paused (as decide_claim)."""
    return rec.phase == SandboxPhase.RUNNING and rec.ready and not rec.paused


class OfferedMembers:
    def __init__(self, cache: SandboxCache) -> None:
        self.cache = cache
        self._heaps: dict[str, list[Entry]] = {}  # pool key -> its claimable members
        self._offered: dict[str, set[str]] = {}  # pool key -> the keys in its heap
        for rec in cache.records.values():
            self.on_sandbox(None, rec)
        cache.listeners.append(self.on_sandbox)

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        if new is None or new.pool_key is None or not claimable(new):
            return  # what is no longer claimable is dropped when it reaches the top
        offered = self._offered.setdefault(new.pool_key, set())
        if new.key not in offered:
            offered.add(new.key)
            heapq.heappush(self._heaps.setdefault(new.pool_key, []), _entry(new))

    def _valid(self, pool_key: str, entry: Entry) -> SandboxRecord | None:
        rec = self.cache.get(entry[2])
        if rec is None or rec.pool_key != pool_key or not claimable(rec):
            return None
        return rec if _entry(rec) == entry else None

    def first(
        self, pool_key: str, owner_uid: str, skip: Collection[str] = ()
    ) -> SandboxRecord | None:
        """The oldest claimable member of the pool owned by ``owner_uid`` whose key is
        not in ``skip`` (members being taken); None when there is none."""
        heap = self._heaps.get(pool_key)
        if not heap:
            return None
        offered = self._offered[pool_key]
        aside: list[Entry] = []
        found: SandboxRecord | None = None
        while heap:
            entry = heap[0]
            rec = self._valid(pool_key, entry)
            if rec is None:
                heapq.heappop(heap)
                now = self.cache.get(entry[2])
                if now is not None and now.pool_key == pool_key and claimable(now):
                    if entry[2] in offered:  # re-created under its name: its new entry
                        heapq.heappush(heap, _entry(now))
                    continue
                offered.discard(entry[2])
                continue
            if rec.key in skip or rec.owner_uid != owner_uid:
                aside.append(heapq.heappop(heap))
                continue
            found = rec
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    def count(self, pool_key: str) -> int:
        """Entries held for the pool (stale ones included until they surface)."""
        return len(self._heaps.get(pool_key, ()))


def _entry(rec: SandboxRecord) -> Entry:
    return (rec.created_at, rec.name, rec.key)


__all__ = ["OfferedMembers", "claimable"]
