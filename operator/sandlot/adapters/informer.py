"""A minimal informer for the agents' node Leases: list, then watch from the list's
resourceVersion, and start over on any error (with a capped backoff).

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
from kubernetes.client.rest import ApiException

from sandlot.adapters.objects import LeaseRecord, _lease_record
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
        watch_timeout: int = 300,
        on_view_restored: Callable[[], None] | None = None,
    ) -> None:
        self.api: Any = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.on_event = on_event
        # Called after the first list and after every list that follows a failure:
        # from then on the view is continuous again (a routine watch timeout is not
        # a gap). The node-health controller waits a lease duration after it before
        # it reaps, so leases the agents renew once the API server is back count.
        self.on_view_restored = on_view_restored
        self.label_selector = label_selector
        self.watch_timeout = watch_timeout
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
        while not self._stop.is_set():
            try:
                listed = self.api.list_namespaced_lease(
                    self.namespace, label_selector=self.label_selector, _request_timeout=30
                )
                names = set()
                for item in listed.items:
                    record = _lease_record(item)
                    names.add(record.name)
                    self.on_event("SYNC", record)
                self.synced.set()
                if gap and self.on_view_restored is not None:
                    self.on_view_restored()
                gap = False
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    self.api.list_namespaced_lease,
                    self.namespace,
                    label_selector=self.label_selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=self.watch_timeout,
                    _request_timeout=self.watch_timeout + 30,
                ):
                    if self._stop.is_set():
                        return
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        break  # typically 410 Gone: list again
                    self.on_event(event["type"], _lease_record(obj))
                backoff = 0.5
            except (ApiException, OSError, ValueError) as e:
                gap = True
                if self._stop.is_set():
                    return
                log.warning("lease watch failed (%s); listing again in %.1fs", e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as e:  # urllib3 protocol errors and the like
                gap = True
                if self._stop.is_set():
                    return
                log.warning("lease watch broke (%s: %s); listing again", type(e).__name__, e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
