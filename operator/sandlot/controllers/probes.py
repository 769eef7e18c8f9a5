"""The operator's liveness: a task on the event loop notes the time every
``TICK_SECONDS``; the probe (HTTP thread) asks ``sandlot.policy.probes.operator_live``
whether the loop, where every controller runs, still moves."""

from __future__ import annotations

import asyncio
import time

from sandlot.policy.probes import Probe, operator_live

TICK_SECONDS = 1.0
# A loop silent this long is stuck (no pass of any controller blocks it this long).
STALL_AFTER_SECONDS = 30.0


class LoopTicker:
    def __init__(self, stall_after: float = STALL_AFTER_SECONDS) -> None:
        self.stall_after = stall_after
        self.last_tick: float | None = None

    async def run(self) -> None:
        while True:
            self.last_tick = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)

    def probe(self) -> Probe:
        return operator_live(self.last_tick, time.monotonic(), self.stall_after)
