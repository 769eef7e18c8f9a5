"""The shapes the operator's parts take (threads, tasks, kopf, leadership), over the
programs' one start-up mechanism (``adapters.startorder``: ``Part``, ``run_parts``);
what the parts are and their order is ``controllers.operator.build_parts``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

import kopf

from sandlot.adapters.kube import WriteFence
from sandlot.adapters.startorder import Part, run_parts

log = logging.getLogger(__name__)

# How long a stopping leader waits for its writes in flight before it gives up
# releasing the Lease early (it then expires by itself).
SHUTDOWN_DRAIN_SECONDS = 5.0
# kopf stops its root tasks without a bound and waits 5 s for tasks it calls hung;
# past this, its task is cancelled so the parts older than kopf still stop.
KOPF_STOP_SECONDS = 20.0


def in_thread(fn: Callable[[], Any]) -> Callable[[], Awaitable[None]]:
    """A blocking call (a join, a drain) as a step that keeps the loop free."""

    async def step() -> None:
        await asyncio.to_thread(fn)

    return step


class TaskPart:
    """Coroutines run as tasks from start until stop (which cancels and awaits them)."""

    def __init__(self, name: str, *runs: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.runs = runs
        self.tasks: list[asyncio.Task[None]] = []

    def part(self) -> Part:
        return Part(self.name, self.start, self.stop)

    async def start(self) -> None:
        self.tasks = [asyncio.create_task(_as_coroutine(run), name=self.name) for run in self.runs]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _as_coroutine(run: Callable[[], Awaitable[None]]) -> None:
    await run()


class Elector(Protocol):
    def start(self) -> None: ...
    def stop(self, release: bool = True, timeout: float = 5.0) -> None: ...


def leadership_part(
    fence: WriteFence,
    elector: Elector | None,
    *,
    on_no_election: Callable[[], None] = lambda: None,
    drain_seconds: float = SHUTDOWN_DRAIN_SECONDS,
) -> Part:
    """The elector; its stop closes the write fence first and releases the Lease
    only once no write of this replica is still in flight (else it expires)."""

    async def start() -> None:
        if elector is None:
            on_no_election()
        else:
            elector.start()

    async def stop() -> None:
        # Passes may still write from their threads: refuse every new write, wait for
        # those already sent, and only then let a standby take over.
        drained = await asyncio.to_thread(fence.close, drain_seconds)
        if not drained:
            log.warning("writes still in flight at shutdown; the leader Lease is left to expire")
        if elector is not None:
            await asyncio.to_thread(elector.stop, drained)

    return Part("leadership", start, stop)


class KopfPart:
    """kopf through its public ``spawn_tasks``/``run_tasks``, with its own flags.

    kopf counts every task that appeared after its start as its own and waits 5 s
    for them when it stops. Started after the parts it depends on and before the
    workers, and stopped after the workers are gone, it finds none of ours.
    """

    def __init__(self, registry: kopf.OperatorRegistry, memories: Any) -> None:
        self.registry = registry
        self.memories = memories
        self.ready = asyncio.Event()
        self.stop_flag = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def part(self) -> Part:
        return Part("kopf", self.start, self.stop)

    async def start(self) -> None:
        existing: Collection[asyncio.Task[Any]] = asyncio.all_tasks()
        tasks = await kopf.spawn_tasks(
            registry=self.registry,
            memories=self.memories,
            clusterwide=True,
            standalone=True,
            stop_flag=self.stop_flag,
            ready_flag=self.ready,
        )
        self.task = asyncio.create_task(kopf.run_tasks(tasks, ignored=existing), name="kopf")

    async def stop(self) -> None:
        self.stop_flag.set()
        if self.task is None:
            return
        done, _ = await asyncio.wait({self.task}, timeout=KOPF_STOP_SECONDS)
        if not done:
            log.error("kopf did not stop within %.0f s; cancelled", KOPF_STOP_SECONDS)
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            return
        self.task.result()  # kopf's own failure, if it had one, is the program's


async def serve_until(stop: asyncio.Event, *ends: asyncio.Task[Any] | None) -> None:
    """Until ``stop`` is set or one of ``ends`` (kopf) ends by itself."""
    waiting = asyncio.create_task(stop.wait(), name="stop-flag")
    try:
        await asyncio.wait(
            {waiting, *(t for t in ends if t is not None)}, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


__all__ = [
    "KopfPart",
    "Part",
    "TaskPart",
    "in_thread",
    "leadership_part",
    "run_parts",
    "serve_until",
]
