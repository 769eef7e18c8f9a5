"""Marking a node's sandboxes Dead, for every node being marked at once, over one
shared bound of status writes in flight.

Node passes run several at a time (the node queue's workers), so nodes lost
together are not decided one after another, each waiting for the marks of the
one before. Their writes share one pool of ``mark_concurrency`` threads: however
many nodes are lost at once, the API server sees at most that many marks in
flight, and a burst costs the time its writes take at the API server's rate, not
the sum of its nodes' round trips. A node's listing runs beside that pool, so it
never queues behind another node's marks.

A node's sandboxes are listed in pages, and each page's marks start as soon as it
arrives, while the next page is listed: the first write goes out after one small
page, not after the whole listing (at 1,000 sandboxes on one node the listing alone
was a tenth of the marking's time). The pages grow from twice the write threads to
``MAX_PAGE``, so a large node costs few requests.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from sandlot.adapters.objects import MarkResult, Objects, mark_one
from sandlot.adapters.statuswrite import WriteResult
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.controllers.metrics import OperatorMetrics

# Pages grow from twice the write threads (every one busy while the next page is
# listed) to MAX_PAGE: at the default 16 threads a node of 30 sandboxes is one
# request, one of 1,000 five.
MAX_PAGE = 500


class NotLeader(RuntimeError):
    """Leadership was lost in the middle of a pass; the new leader redoes it."""


def _live(sandbox: Mapping[str, Any]) -> bool:
    # Non-terminal: Scheduled and Running, and Pending ones already bound to the node.
    return (sandbox.get("status") or {}).get("phase", SandboxPhase.PENDING) not in TERMINAL_PHASES


class Marker:
    """Lists a node's sandboxes and marks the live ones Dead, ``concurrency`` writes
    in flight across every node marked at once."""

    def __init__(
        self,
        objects: Objects,
        metrics: OperatorMetrics,
        *,
        concurrency: int,
        is_leader: Callable[[], bool],
    ) -> None:
        self.objects = objects
        self.metrics = metrics
        self.is_leader = is_leader
        self._writes = ThreadPoolExecutor(concurrency, thread_name_prefix="mark")
        self._first_page = min(2 * concurrency, MAX_PAGE)

    async def mark_node(self, name: str, reason: str, message: str, now: datetime) -> MarkResult:
        started = time.perf_counter()
        try:
            return await self._list_and_mark(name, reason, message, now)
        finally:
            self.metrics.mark_seconds.observe(time.perf_counter() - started)

    async def _list_and_mark(
        self, name: str, reason: str, message: str, now: datetime
    ) -> MarkResult:
        loop = asyncio.get_running_loop()
        one = functools.partial(mark_one, self.objects, reason=reason, message=message, now=now)
        writes: list[asyncio.Future[tuple[str, WriteResult]]] = []
        token: str | None = None
        limit = self._first_page
        try:
            while True:
                page, token = await asyncio.to_thread(
                    self.objects.node_sandboxes_page, name, limit, token
                )
                if not self.is_leader():
                    raise NotLeader(
                        f"node {name}: leadership lost while listing its sandboxes; "
                        f"{len(writes)} marks already sent, no more"
                    )
                writes.extend(
                    loop.run_in_executor(self._writes, one, sb) for sb in page if _live(sb)
                )
                if token is None:
                    break
                limit = min(limit * 2, MAX_PAGE)
        finally:
            # A failed listing or a lost leadership still waits for the marks already
            # sent: none is left running behind the pass that sent it.
            done = await asyncio.gather(*writes, return_exceptions=True)
        result = MarkResult()
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
            result.record(*outcome)
        self.metrics.marked_dead.labels(reason=reason).inc(len(result.marked))
        if result.failed:
            self.metrics.mark_failures.inc(len(result.failed))
        return result
