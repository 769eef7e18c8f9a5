"""The node's proof of life: its SandboxNode's agent-owned status and its Lease.

The Lease (named after the node, in sandlot's namespace) is the only thing that
makes a node READY, so it is renewed on its own thread: a slow sandbox start or a
wedged teardown never delays it. It is started only after the start-up sweep,
because a node must not look healthy while it still runs containers it should
have torn down. A renewal that fails (API down, a 409 from a stale version) is
logged and retried at the next tick with a fresh read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sandlot.adapters.agentapi import ensure_node
from sandlot.adapters.objects import LeaseRecord, Leases, Objects
from sandlot.api.keys import AGENT_LEASE_LABEL
from sandlot.api.timestamps import utcnow

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        objects: Objects,
        leases: Leases,
        *,
        node_name: str,
        lease_duration: float,
        renew_interval: float,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.objects = objects
        self.leases = leases
        self.node_name = node_name
        self.lease_duration = max(1, round(lease_duration))
        self.renew_interval = renew_interval
        self._clock = clock
        self._record: LeaseRecord | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.last_renewed: datetime | None = None
        self.first_renewed = threading.Event()

    def register(self, status: dict[str, Any]) -> dict[str, Any]:
        """Create the SandboxNode if needed and write the agent-owned status fields."""
        ensure_node(self.objects, self.node_name)
        return self.objects.patch_node_status(self.node_name, status)

    def renew(self) -> LeaseRecord:
        """Create or renew the Lease once (raises on failure)."""
        now = self._clock()
        labels = {AGENT_LEASE_LABEL: "true"}
        record = self._record or self.leases.get(self.node_name)
        if record is None:
            record = self.leases.create(
                self.node_name,
                holder=self.node_name,
                duration_seconds=self.lease_duration,
                now=now,
                labels=labels,
            )
        else:
            try:
                record = self.leases.update(
                    record,
                    holder=self.node_name,
                    duration_seconds=self.lease_duration,
                    renew_time=now,
                    acquire_time=record.acquire_time if record.holder == self.node_name else now,
                    labels=labels,
                )
            except Exception:
                self._record = None  # re-read next time (stale version, or it was deleted)
                raise
        self._record = record
        self.renewals += 1
        self.last_renewed = now
        self.first_renewed.set()
        return record

    def start(self) -> None:
        """Renew now (synchronously, so READY is true when this returns), then on a thread."""
        try:
            self.renew()
        except Exception as exc:
            log.warning("node %s: first lease renewal failed: %s", self.node_name, exc)
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.renew_interval):
            try:
                self.renew()
            except Exception as exc:
                log.warning("node %s: lease renewal failed: %s", self.node_name, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_interval + 5)
