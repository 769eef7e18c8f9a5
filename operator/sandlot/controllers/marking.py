"""Marking a node's sandboxes Dead, for every node being marked at once, over one
shared bound of status writes in flight.

Node passes run several at a time (the node queue's workers), so nodes lost
together are not decided one after another. Their writes share one pool of
``mark_concurrency`` threads: however many nodes are lost at once, the API server
sees at most that many marks in flight. A node's listing runs beside that pool, so
it never queues behind another node's marks.

A node's sandboxes are listed in at most two requests, and the first one's marks
start as soon as it arrives: a first page of ``FIRST_PAGE_PER_WRITER`` marks per
write thread keeps every thread busy while a larger node is listed whole, in one
consistent read the API server's watch cache answers (never with the page's
continue token: a continuation is answered at the first page's resourceVersion,
and ran past its read timeouts while the node's own marks changed it). The
measurements behind these choices are in docs/measurements.md ("Marking at 500
nodes: the first page, and a floor that writes what a mark writes").

A node can come back while it is being marked: a pass given ``came_back`` asks it
before every write it has not sent yet, and once it says yes sends none, so what
is marked after the renewal was observed is at most the writes already in flight
(one per write thread). The sandboxes left alone are returned as such, and the
pass counts as incomplete: no latch is set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sandlot.adapters.objects import Objects
from sandlot.adapters.statuswrite import WriteOutcome, WriteResult, write_status
from sandlot.api.common import join_key
from sandlot.api.reasons import EventReason
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.policy.marking import dead_status
from sandlot.policy.statemove import movable_object

log = logging.getLogger(__name__)

# Marks a write thread has from a node's first page: about 16 of its round trips
# (0.8 s at 300 marks a second through 16 threads) while the node is listed whole.
FIRST_PAGE_PER_WRITER = 16


class NotLeader(RuntimeError):
    """Leadership was lost in the middle of a pass; the new leader redoes it."""


@dataclass
class NodeMarking:
    """What a node's marking pass achieved, and what it left alone."""

    marked: list[str] = field(default_factory=list)
    already_terminal: list[str] = field(default_factory=list)
    """Found terminal, deleted or replaced (new uid, other node) after a 409."""
    failed: dict[str, str] = field(default_factory=dict)
    """Still conflicting after the write's attempts, or failing otherwise: why."""
    left: list[str] = field(default_factory=list)
    """Live sandboxes not marked: the node came back (``came_back``) before their turn."""

    @property
    def complete(self) -> bool:
        return not self.failed and not self.left

    def record(self, key: str, written: WriteResult) -> None:
        """Count one sandbox's write: marked, already terminal (or gone), or failed."""
        if written.outcome is WriteOutcome.WRITTEN:
            self.marked.append(key)
        elif written.outcome in (WriteOutcome.SKIPPED, WriteOutcome.GONE):
            self.already_terminal.append(key)
        else:
            self.failed[key] = written.detail or written.outcome.value

    def outcome(self, node: str, reason: str | None) -> tuple[str, str, str]:
        """How the pass ended, logged, and as an Event's type, reason and message."""
        marked = len(self.marked)
        if self.left:
            message = (f"the node renewed its lease while its sandboxes were marked Dead: "
                       f"{marked} marked, {len(self.left)} left alone")  # fmt: skip
            log.warning("node %s: %s; the latch stays unset", node, message)
            return "Normal", EventReason.MARKING_STOPPED, message
        if self.failed:
            failed = "; ".join(f"{k}: {v}" for k, v in sorted(self.failed.items())[:5])
            log.error("node %s: %d sandboxes marked Dead, %d failed (%s); the latch stays unset",
                      node, marked, len(self.failed), failed)  # fmt: skip
            return "Warning", EventReason.MARKING_FAILED, (
                f"{len(self.failed)} sandboxes could not be marked Dead; retrying"
            )  # fmt: skip
        log.info("node %s: marked %d sandboxes Dead (%s)", node, marked, reason)
        return "Warning", EventReason.SANDBOXES_MARKED_DEAD, (
            f"marked {marked} sandboxes Dead ({reason}); "
            f"{len(self.already_terminal)} were already terminal"
        )  # fmt: skip


def _live(sandbox: Mapping[str, Any]) -> bool:
    # Non-terminal: Scheduled and Running, and Pending ones already bound to the node;
    # not a suspended one whose state was pushed: the scheduler moves that one.
    phase = (sandbox.get("status") or {}).get("phase", SandboxPhase.PENDING)
    return phase not in TERMINAL_PHASES and not movable_object(sandbox)


def _key(sandbox: Mapping[str, Any]) -> tuple[str, str]:
    meta = sandbox.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def mark_one(
    objects: Objects,
    sandbox: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    now: datetime,
    max_attempts: int = 5,
) -> tuple[str, WriteResult]:
    """Set one sandbox to Dead through ``statuswrite.write_status``; its key and outcome.

    Only status is sent (phase, reason, message, its condition merged into the
    others), never spec, with the resourceVersion it was read at as precondition.
    """

    def status_for(current: Mapping[str, Any]) -> dict[str, Any]:
        return dead_status(reason, message, now, current)

    written = write_status(objects, sandbox, status_for, max_attempts=max_attempts)
    namespace, name = _key(sandbox)
    return join_key(namespace, name), written


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
        # Every write thread busy while the rest is listed. At the default 16 a node
        # of up to 256 sandboxes is one request, one of 1,000 two.
        self.first_page = FIRST_PAGE_PER_WRITER * concurrency

    async def mark_node(
        self,
        name: str,
        reason: str,
        message: str,
        now: datetime,
        came_back: Callable[[], bool] | None = None,
    ) -> NodeMarking:
        """Mark ``name``'s live sandboxes Dead, stamped ``now``; stop sending marks once
        ``came_back()`` (asked from the write threads) says the node renewed its lease."""
        started = time.perf_counter()
        try:
            return await self._list_and_mark(name, reason, message, now, came_back)
        finally:
            self.metrics.mark_seconds.observe(time.perf_counter() - started)

    async def _list_and_mark(
        self,
        name: str,
        reason: str,
        message: str,
        now: datetime,
        came_back: Callable[[], bool] | None,
    ) -> NodeMarking:
        loop = asyncio.get_running_loop()
        mark = functools.partial(mark_one, self.objects, reason=reason, message=message, now=now)
        back = threading.Event()  # once the node came back, no thread asks again

        def one(sandbox: Mapping[str, Any]) -> tuple[str, WriteResult | None]:
            if came_back is not None and (back.is_set() or came_back()):
                back.set()
                namespace, sandbox_name = _key(sandbox)
                return join_key(namespace, sandbox_name), None  # left alone
            return mark(sandbox)

        writes: list[asyncio.Future[tuple[str, WriteResult | None]]] = []
        sent: set[tuple[str, str]] = set()

        async def listed(page: list[dict[str, Any]]) -> None:
            if not self.is_leader():
                raise NotLeader(
                    f"node {name}: leadership lost while listing its sandboxes; "
                    f"{len(writes)} marks already sent, no more"
                )
            fresh = [sb for sb in page if _key(sb) not in sent and _live(sb)]
            sent.update(_key(sb) for sb in page)
            writes.extend(loop.run_in_executor(self._writes, one, sb) for sb in fresh)

        try:
            began = time.perf_counter()
            page, more = await asyncio.to_thread(
                self.objects.node_sandboxes_page, name, self.first_page
            )
            await listed(page)
            if more is not None:  # the rest: the node whole, in one request
                paged = time.perf_counter()
                whole = await asyncio.to_thread(self.objects.list_node_sandboxes, name)
                # Whether the write threads ran dry while the node was listed whole.
                log.info(
                    "node %s: a first page of %d in %.3fs, the node whole (%d) %.3fs later; "
                    "%d of the page's %d marks done by then",
                    name, len(page), paged - began, len(whole), time.perf_counter() - paged,
                    sum(w.done() for w in writes), len(writes),
                )  # fmt: skip
                await listed(whole)
        finally:
            # A failed listing or a lost leadership still waits for the marks already
            # sent: none is left running behind the pass that sent it.
            done = await asyncio.gather(*writes, return_exceptions=True)
        result = NodeMarking()
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
            key, written = outcome
            if written is None:
                result.left.append(key)
            else:
                result.record(key, written)
        self.metrics.marked_dead.labels(reason=reason).inc(len(result.marked))
        if result.failed:
            self.metrics.mark_failures.inc(len(result.failed))
        return result
