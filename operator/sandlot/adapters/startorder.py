"""Start-up as data, for every program: a list of parts, started in order and
stopped in exact reverse order by construction (an exit stack), as kopf's
``spawn_tasks`` and controller-runtime's ``Manager`` do.

A part that fails to start stops those started before it, newest first; a part
whose stop fails does not keep the older ones running. The operator runs its parts
on its event loop (``run_parts``); the agent and the gateway, which are threads,
on ``StartedParts``. Which parts a program has, and their order, is each program's
own (``controllers.operator``, ``agent.main``, ``gateway.runner``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


async def _nothing() -> None:
    return None


def _none() -> None:
    return None


@dataclass(frozen=True)
class Part:
    """One piece of a program run on an event loop: ``start`` brings it up, ``stop``
    takes it down."""

    name: str
    start: Callable[[], Awaitable[None]] = _nothing
    stop: Callable[[], Awaitable[None]] = _nothing


@dataclass(frozen=True)
class ThreadPart:
    """One piece of a threaded program. ``start`` answers whether it came up: False
    (asked to stop while it waited) ends the start-up there, and this part, which
    did not start, is not stopped."""

    name: str
    start: Callable[[], bool | None] = _none
    stop: Callable[[], object] = _none


def names_of(parts: Sequence[Part] | Sequence[ThreadPart]) -> list[str]:
    """The parts' names in their order; each name once."""
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"part names must be unique, got {names}")
    return names


async def run_parts(parts: Sequence[Part], serve: Callable[[], Awaitable[None]]) -> None:
    """Start ``parts`` in order, ``serve`` until it returns, then stop them in reverse.

    Only a part whose start returned is stopped; an exception from a start or from
    ``serve`` propagates once every started part is stopped.
    """
    names_of(parts)
    async with AsyncExitStack() as stack:
        for part in parts:
            log.debug("starting %s", part.name)
            await part.start()
            stack.push_async_callback(_stop, part)
        await serve()


async def _stop(part: Part) -> None:
    log.debug("stopping %s", part.name)
    await part.stop()


class StartedParts:
    """Threaded parts started in order; ``close`` stops the started ones in reverse.

    ``start`` and ``close`` are apart because a threaded program's caller holds
    them apart (``start()`` returns once it serves, ``shutdown()`` comes later);
    ``close`` is safe to call more than once, and before or without ``start``.
    """

    def __init__(self) -> None:
        self._stack = ExitStack()
        self.started: list[str] = []

    def start(self, parts: Sequence[ThreadPart]) -> bool:
        """Start ``parts`` in order; False when one did not come up (the rest are not
        started). A start that raises stops those before it, then propagates."""
        names_of(parts)
        try:
            for part in parts:
                log.debug("starting %s", part.name)
                if part.start() is False:
                    log.debug("%s did not start", part.name)
                    return False
                self._stack.callback(self._stop, part)
                self.started.append(part.name)
        except BaseException:
            self.close()
            raise
        return True

    def _stop(self, part: ThreadPart) -> Any:
        log.debug("stopping %s", part.name)
        self.started.remove(part.name)
        return part.stop()

    def close(self) -> None:
        """Stop every started part, newest first (each once)."""
        self._stack.close()


__all__ = ["Part", "StartedParts", "ThreadPart", "names_of", "run_parts"]
