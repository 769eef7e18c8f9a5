"""The two kopf handlers most controllers register, written once: a watch that hands
every event of a kind to a controller's method, and a loop that lives from kopf's
start-up to its clean-up.

Both handlers are coroutines on purpose: kopf runs a plain function in a thread,
where a controller's ``on_*`` method would change its caches while a pass on the
event loop iterates them, or touch an asyncio queue off its loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import kopf

OnEvent = Callable[[str | None, kopf.Body], None]
"""A controller's handler of one watch event: its type (None for a listing) and body."""


def forward_events(
    registry: kopf.OperatorRegistry,
    resource: tuple[str, str, str],
    on_event: OnEvent,
    *,
    name: str,
) -> None:
    """Hand every event of ``resource`` (group, version, plural) to ``on_event``,
    from a watch-only handler named ``name``."""
    group, version, plural = resource

    @kopf.on.event(group, version, plural, id=name, registry=registry)
    async def forward(body: kopf.Body, **kwargs: Any) -> None:
        on_event(kwargs.get("type"), body)


def run_while_operating(
    registry: kopf.OperatorRegistry,
    loop: Callable[[], Coroutine[Any, Any, None]],
    *,
    name: str,
) -> None:
    """Run ``loop()`` as a task from kopf's start-up (handler ``name``) to its
    clean-up (handler ``name``/stop), which cancels it and waits until it has ended."""
    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(id=name, registry=registry)
    async def start(**_: Any) -> None:
        tasks.append(asyncio.get_running_loop().create_task(loop()))

    @kopf.on.cleanup(id=f"{name}/stop", registry=registry)
    async def stop(**_: Any) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def resync_while_operating(
    registry: kopf.OperatorRegistry,
    kick: Callable[[], None],
    leading: Callable[[], bool],
    *,
    interval: float,
    name: str,
) -> None:
    """``kick()`` every ``interval`` seconds while this replica leads, from kopf's
    start-up to its clean-up (``run_while_operating``)."""

    async def resync() -> None:
        while True:
            await asyncio.sleep(interval)
            if leading():
                kick()

    run_while_operating(registry, resync, name=name)


__all__ = ["OnEvent", "forward_events", "resync_while_operating", "run_while_operating"]
