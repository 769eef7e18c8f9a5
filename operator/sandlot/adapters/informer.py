"""A minimal informer for the agents' node Leases: list, then watch from the list's
resourceVersion, resume each watch from the last event seen, and list again only
after an error or a 410 (with a capped backoff).

The operator keeps every node's Lease in memory from this stream, so judging a
node READY costs no request per pass, and a handled dead node costs none at all.
It watches only sandlot's namespace and only Leases labelled as agent leases, so
its RBAC is a namespaced Role, not cluster-wide access to Leases.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch

from sandlot.adapters.objects import LeaseRecord, _lease_record, lease_record_of
from sandlot.adapters.startup import api_error_line
from sandlot.api.keys import AGENT_LEASE_LABEL

log = logging.getLogger(__name__)

LeaseCallback = Callable[[str, LeaseRecord], None]  # (ADDED|MODIFIED|DELETED|SYNC, lease)


class LeaseInformer:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        on_event: LeaseCallback,
        *,
        label_selector: str = f"{AGENT_LEASE_LABEL}=true",
        watch_timeout: int = 20,
        on_view_restored: Callable[[], None] | None = None,
        on_heard: Callable[[], None] | None = None,
        on_view_lost: Callable[[], None] | None = None,
    ) -> None:
        self.api: Any = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.on_event = on_event
        # Called after the first list and after every list that follows a failure:
        # from then on the view is continuous again (a routine watch timeout is not
        # a gap). The node-health controller waits a lease duration after it before
        # it reaps, so leases the agents renew once the API server is back count.
        self.on_view_restored = on_view_restored
        # Called when the watch or a list fails: the view has a gap from then until
        # the list that restores it, and nothing may be reaped from it meanwhile.
        self.on_view_lost = on_view_lost
        # Called whenever the stream proves alive (an event, a watch that ended on
        # time). The server ends each watch after ``watch_timeout`` and the client gives
        # up reading half that again later, so a connection that died silently is
        # noticed within 1.5 x ``watch_timeout``, not at a default read timeout of
        # minutes: whoever reaps from this view must not trust it longer than that.
        self.on_heard = on_heard
        self.label_selector = label_selector
        if watch_timeout < 1:
            raise ValueError(f"watch_timeout must be at least 1 s, got {watch_timeout}")
        self.watch_timeout = watch_timeout
        self.read_timeout = watch_timeout + max(1, watch_timeout // 2)
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="lease-informer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.5
        gap = True
        known: set[str] = set()
        while not self._stop.is_set():
            try:
                version = self._list(known, restored=gap)
                gap = False
                # Watch from the list, then from the last event seen, until the server
                # says the version is too old (list again) or the stream breaks.
                while version is not None and not self._stop.is_set():
                    version = self._watch_once(version, known)
                backoff = 0.5
            except Exception as e:  # ApiException, OSError, urllib3 protocol errors...
                gap = True
                if self._stop.is_set():
                    return
                if self.on_view_lost is not None:
                    self.on_view_lost()
                log.warning(
                    "lease watch failed (%s: %s); listing again in %.1fs",
                    type(e).__name__,
                    api_error_line(e),
                    backoff,
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self, known: set[str], *, restored: bool) -> str | None:
        listed = self.api.list_namespaced_lease(
            self.namespace, label_selector=self.label_selector, _request_timeout=30
        )
        names = set()
        for item in listed.items:
            record = _lease_record(item)
            names.add(record.name)
            self.on_event("SYNC", record)
        for gone in known - names:  # deleted while no watch was there to say so
            self.on_event("DELETED", LeaseRecord(gone, None, None, 0, ""))
        known.clear()
        known.update(names)
        self.synced.set()
        if restored and self.on_view_restored is not None:
            self.on_view_restored()
        self._heard()
        return str(listed.metadata.resource_version or "") or None

    def _watch_once(self, version: str, known: set[str]) -> str | None:
        """One watch from ``version``; the version to resume from, or None to list again."""
        self._watch = watch.Watch()
        for event in self._watch.stream(
            self.api.list_namespaced_lease,
            self.namespace,
            label_selector=self.label_selector,
            resource_version=version,
            timeout_seconds=self.watch_timeout,
            _request_timeout=self.read_timeout,
            deserialize=False,  # JSON dicts: the generated models cost a core at scale
        ):
            if self._stop.is_set():
                return None
            if event["type"] == "ERROR":
                return None  # typically 410 Gone: list again
            record = lease_record_of(event["object"])
            if event["type"] == "DELETED":
                known.discard(record.name)
            else:
                known.add(record.name)
            version = record.resource_version or version
            self.on_event(event["type"], record)
            self._heard()
        self._heard()  # ended on time: the server was there to end it
        return version

    def _heard(self) -> None:
        if self.on_heard is not None:
            self.on_heard()
