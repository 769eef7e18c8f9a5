"""When kopf's lists of pools, claims and SandboxNodes are in.

kopf lists each kind it watches and hands every object over as an event, but never
says when a list is over. A kind counts as listed here once every object a list of
our own found has been handed over (or its deletion has): from then on the
controller's cache holds at least what the server held at that moment, which is
what client-go's ``HasSynced`` means. It costs one paged LIST per kind at start
(small kinds). An object deleted before kopf listed it is never handed over, so a
kind not complete within ``relist`` seconds is listed again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping

log = logging.getLogger(__name__)

RELIST = 5.0
POLL = 0.2


class KopfListed:
    def __init__(
        self,
        seen: Mapping[str, Callable[[], Collection[str]]],
        list_keys: Callable[[str], set[str]],
        *,
        on_listed: Callable[[], None],
        relist: float = RELIST,
        poll: float = POLL,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``seen``: per plural, the keys the controller has been handed ("ns/name",
        or the name of a cluster-scoped object), deleted ones included."""
        self.seen = dict(seen)
        self.list_keys = list_keys
        self.on_listed = on_listed
        self.relist = relist
        self.poll = poll
        self.clock = clock
        self.sleep = sleep
        self.pending = set(self.seen)

    def unlisted(self) -> list[str]:
        return sorted(self.pending)

    def has_listed(self, plural: str) -> bool:
        return plural not in self.pending

    async def run(self) -> None:
        while self.pending:
            for plural in sorted(self.pending):
                if await self._listed(plural):
                    self.pending.discard(plural)
        self.on_listed()

    async def _listed(self, plural: str) -> bool:
        try:
            keys = await asyncio.to_thread(self.list_keys, plural)
        except Exception as e:
            log.warning("cannot list %s to know when kopf's list is in: %s", plural, e)
            await self.sleep(self.relist)
            return False
        deadline = self.clock() + self.relist
        while True:
            missing = keys.difference(self.seen[plural]())
            if not missing:
                return True
            if self.clock() >= deadline:
                log.info(
                    "%s: %d listed objects not handed over yet; listing again", plural, len(missing)
                )
                return False
            await self.sleep(self.poll)
