"""Marking a node's sandboxes Dead, for every node being marked at once, over one
shared bound of status writes in flight.

Node passes run several at a time (the node queue's workers), so nodes lost
together are not decided one after another, each waiting for the marks of the
one before. Their writes share one pool of ``mark_concurrency`` threads: however
many nodes are lost at once, the API server sees at most that many marks in
flight, and a burst costs the time its writes take at the API server's rate, not
the sum of its nodes' round trips. A node's listing runs beside that pool, so it
never queues behind another node's marks.
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
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.controllers.metrics import OperatorMetrics


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

    async def mark_node(self, name: str, reason: str, message: str, now: datetime) -> MarkResult:
        started = time.perf_counter()
        try:
            return await self._list_and_mark(name, reason, message, now)
        finally:
            self.metrics.mark_seconds.observe(time.perf_counter() - started)

    async def _list_and_mark(
        self, name: str, reason: str, message: str, now: datetime
    ) -> MarkResult:
        sandboxes = await asyncio.to_thread(self.objects.list_node_sandboxes, name)
        if not self.is_leader():
            raise NotLeader(f"node {name}: leadership lost before marking; nothing marked")
        loop = asyncio.get_running_loop()
        one = functools.partial(mark_one, self.objects, reason=reason, message=message, now=now)
        writes = [loop.run_in_executor(self._writes, one, sb) for sb in sandboxes if _live(sb)]
        result = MarkResult()
        for key, written in await asyncio.gather(*writes):
            result.record(key, written)
        self.metrics.marked_dead.labels(reason=reason).inc(len(result.marked))
        if result.failed:
            self.metrics.mark_failures.inc(len(result.failed))
        return result
