"""Lease-based leader election, as client-go's leaderelection does it.

kopf's own peering freezes every peer of equal priority and keeps a peer alive
for 60 s, so it cannot give "exactly one replica acts and a standby takes over
within 15 s". This elector can: the holder renews a coordination.k8s.io Lease
every ``retry_period``; a candidate takes the Lease over once it has seen the
same record unchanged for ``lease_duration`` (measured on the candidate's own
clock, never by comparing with the holder's timestamps, so clock skew does not
matter); a holder that cannot renew within ``renew_deadline`` steps down before
anyone else may take over. A holder that stops cleanly releases the Lease so a
standby takes over at its next retry.

Leadership is a fact about time, not a flag: ``leading()`` is true only while the
last successful renewal was *sent* less than ``renew_deadline`` ago on this
replica's monotonic clock. A standby cannot take over before ``lease_duration``
after it saw that renewal land, which is later still, so a replica that was frozen
(SIGSTOP, a long GC pause, a VM migration) or cut off knows it is no longer leading
the moment it runs again, before its election thread has noticed anything. Pair it
with ``adapters.kube.WriteFence`` and no write of a deposed leader is ever sent.
Give the elector an ApiClient whose request timeout is below ``renew_deadline``, so
one hung call cannot hold the loop past it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import LeaseRecord, Leases
from sandlot.adapters.startup import api_error_line

log = logging.getLogger(__name__)


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 12.0,
        renew_deadline: float = 8.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("retry_period < renew_deadline < lease_duration must hold")
        self.leases = Leases(api, namespace)
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_change = on_change
        self.clock = clock
        self.is_leader = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: tuple[str | None, datetime | None, str] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if release and self.is_leader.is_set():
            self._release()
        self._set_leader(False)

    def leading(self) -> bool:
        """Whether this replica may act now: it holds the Lease and renewed it in time."""
        return self.is_leader.is_set() and self.clock() - self._last_renew < self.renew_deadline

    # -- loop -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._try_acquire_or_renew()
            except Exception as e:  # an API outage must not kill the elector
                log.warning("leader election: %s", api_error_line(e))
            if self.is_leader.is_set() and self.clock() - self._last_renew > self.renew_deadline:
                log.error(
                    "leader election: could not renew %s for %.0fs; stepping down",
                    self.name,
                    self.renew_deadline,
                )
                self._set_leader(False)
            self._stop.wait(self.retry_period)

    def _try_acquire_or_renew(self) -> None:
        now = datetime.now(UTC)
        duration = max(1, round(self.lease_duration))
        record = self.leases.get(self.name)
        if record is None:
            sent = self.clock()
            try:
                self.leases.create(
                    self.name, holder=self.identity, duration_seconds=duration, now=now
                )
            except ApiException as e:
                if e.status == 409:
                    return  # somebody else created it first
                raise
            self._renewed(acquired=True, sent=sent)
            return
        self._observe(record)
        if record.holder == self.identity:
            self._update(record, duration, now, acquired=False)
            return
        free = not record.holder
        expired = self.clock() - self._observed_at > self.lease_duration
        if free or expired:
            self._update(record, duration, now, acquired=True)
        elif self.is_leader.is_set():
            self._set_leader(False)  # someone else holds it now

    def _update(self, record: LeaseRecord, duration: int, now: datetime, *, acquired: bool) -> None:
        # Timed before it is sent: the standby times the same renewal after it landed,
        # so this replica's deadline always falls before the standby may take over.
        sent = self.clock()
        try:
            self.leases.update(
                record,
                holder=self.identity,
                duration_seconds=duration,
                renew_time=now,
                acquire_time=now if acquired else None,
                transitions=record.transitions + 1 if acquired else None,
            )
        except ApiException as e:
            if e.status == 409:
                return  # lost the race; observe again next round
            raise
        self._renewed(acquired=acquired, sent=sent)

    def _observe(self, record: LeaseRecord) -> None:
        key = (record.holder, record.renew_time, record.resource_version)
        if key != self._observed:
            self._observed = key
            self._observed_at = self.clock()

    def _renewed(self, *, acquired: bool, sent: float) -> None:
        self._last_renew = sent
        if acquired:
            log.info("leader election: %s acquired %s", self.identity, self.name)
        self._set_leader(True)

    def _release(self) -> None:
        try:
            record = self.leases.get(self.name)
            if record is not None and record.holder == self.identity:
                self.leases.update(record, holder=None, duration_seconds=1, renew_time=None)
                log.info("leader election: %s released %s", self.identity, self.name)
        except Exception as e:
            log.warning("leader election: release failed: %s", api_error_line(e))

    def _set_leader(self, value: bool) -> None:
        if value == self.is_leader.is_set():
            return
        if value:
            self.is_leader.set()
        else:
            self.is_leader.clear()
        if self.on_change is not None:
            self.on_change(value)
