"""Saying that the mass-failure guard holds, and for how long.

The guard keeps a majority of the fleet from being reaped on a guess, so a fleet
that really lost its majority is held forever. That must reach a person: a
``GuardHolding`` condition on each held node (the policy's), a ``MassFailureHold``
Event on it when the hold begins and again at each whole ``report_every`` (saying
for how long), and ``sandlot_operator_guard_held_seconds``, the longest hold in
seconds, which an alert fires on. The answer is a person's: ``sandlot nodes reap``.

Held moments are the nodes' grace deadlines on the steady clock, recomputed from
their persisted unhealthySince, so a restarted or new leader reports the same
duration; only when each reminder was last posted is in memory (a new leader posts
one at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sandlot.api.reasons import EventReason
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.policy.disruption import GuardSettings, hold_reminder_due
from sandlot.policy.nodehealth import Decision

log = logging.getLogger(__name__)

Post = Callable[[Mapping[str, Any], str, str, str], None]  # body, type, reason, message


def span(delta: timedelta) -> str:
    """``delta`` as people read it: ``1h2m``, ``12m5s``, ``40s``."""
    seconds = max(int(delta.total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


class HoldReporter:
    def __init__(
        self,
        metrics: OperatorMetrics,
        guard: GuardSettings,
        post: Post,
        *,
        clock: Callable[[], datetime],
        wall_time: Callable[[datetime], datetime],
        is_leader: Callable[[], bool],
        on_lifted: Callable[[], None],
    ) -> None:
        self.metrics = metrics
        self.guard = guard
        self.post = post
        self.clock = clock
        self.wall_time = wall_time
        self.is_leader = is_leader
        self.on_lifted = on_lifted
        self.reported = False
        """The last pass found the guard active (passes then judge on a fresh fleet)."""
        self._held: dict[str, datetime] = {}  # node -> when its hold began (steady)
        self._told: dict[str, datetime] = {}  # node -> when its hold was last posted
        metrics.guard_held.set_function(self.held_seconds)

    def held_seconds(self) -> float:
        """The longest current hold, in seconds; 0 on a standby (it decides nothing)."""
        held = list(self._held.values())  # read from the metrics thread
        if not held or not self.is_leader():
            return 0.0
        return max((self.clock() - min(held)).total_seconds(), 0.0)

    def forget(self, name: str) -> None:
        self._held.pop(name, None)
        self._told.pop(name, None)

    def report(self, name: str, decision: Decision, body: Mapping[str, Any], now: datetime) -> None:
        self.metrics.hold_active.set(1 if decision.guard_active else 0)
        since = decision.held_since
        if since is None:
            self.forget(name)
        else:
            self._held[name] = since
            if hold_reminder_due(since, self._told.get(name), now, self.guard.report_every):
                self._told[name] = now
                self._post_hold(body, now - since, since)
        if decision.guard_active and not self.reported:
            log.warning("mass-failure guard active: marking nothing Dead")
        elif not decision.guard_active and self.reported:
            log.info("mass-failure guard lifted")
            self.on_lifted()  # nodes held back may now be due
        self.reported = decision.guard_active

    def _post_hold(self, body: Mapping[str, Any], held: timedelta, since: datetime) -> None:
        if not self.is_leader():
            return
        name = body["metadata"]["name"]
        self.post(
            body,
            "Warning",
            EventReason.MASS_FAILURE_HOLD,
            f"the mass-failure guard has held this node's sandboxes for {span(held)} (its "
            f"grace ended at {self.wall_time(since).isoformat(timespec='seconds')}): most "
            f"of the fleet is NotReady at once, so nothing is marked Dead until the fraction "
            f"drops below {self.guard.disruption_threshold:g}; if the node is known lost, "
            f"`sandlot nodes reap {name}` marks its sandboxes Dead",
        )
