"""Minimal informers: list (in pages), then watch from the list's resourceVersion,
resume each watch from the last event or bookmark seen, and list again only after
an error or a 410 (with a capped backoff). Objects arrive as the API server's
JSON, never as the client's generated models (too costly to build for every event
of a large fleet).

Three kinds are watched this way, each by one thread:

- the agents' node Leases (``LeaseInformer``): the operator keeps every node's
  Lease in memory from this stream, so judging a node READY costs no request per
  pass, and a handled dead node costs none at all. It watches only sandlot's
  namespace and only Leases labelled as agent leases, so its RBAC is a namespaced
  Role, not cluster-wide access to Leases;
- every Sandbox (``SandboxInformer``), for the operator's sandbox cache, and every
  SandboxClaim (``ObjectInformer``), for the claim controller. Taken through kopf,
  each event cost the event loop kopf's work per event (causes, diff-bases,
  handler kwargs) for a handler that only copies a dozen fields: at the API
  server's status-write rate the loop was busy all the time and held the GIL
  against the threads writing the marks (docs/measurements.md, "Marking with the
  operator's own sandbox watch"), and in a burst of claims kopf's share was
  two-fifths of the operator's time.

The agent's caches (``sandboxwatch.WatchCache``) are this same loop, so the whole
project has one way to list, watch, resume and back off.

Back-off, for every informer: after a failed list or watch (or one the server
ended at once) the next list waits 0.5 s, doubling to at most 10 s, each wait cut
to a random point between its half and its whole, so a fleet of agents that lost
the API server together does not come back to it in step. 10 s, not client-go's
30 s: the operator's view of the Leases is what failover waits on after an
outage, and a relist costs at most one page a second per informer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from sandlot.adapters.kubeprivate import watch_lines
from sandlot.adapters.objects import LeaseRecord, lease_record_of
from sandlot.adapters.startup import api_error_line
from sandlot.api.common import GROUP, SANDBOXES, VERSION, key_of, split_key
from sandlot.api.keys import AGENT_LEASE_LABEL
from sandlot.policy.backoff import capped_doubling

log = logging.getLogger(__name__)

LeaseCallback = Callable[[str, LeaseRecord], None]  # (ADDED|MODIFIED|DELETED|SYNC, lease)
RawCallback = Callable[[str, Mapping[str, Any]], None]  # (ADDED|MODIFIED|DELETED|SYNC, body)

LIST_PAGE = 500
LIST_TIMEOUT = 60.0
BACKOFF_START = 0.5
MAX_BACKOFF = 10.0
# A watch that ends this soon without an event is treated as a failure, so a server
# that closes watches at once is not asked again in a tight loop.
SHORTEST_HEALTHY_WATCH = 1.0


def _jitter(watch_timeout: int) -> int:
    """Most a watch's server timeout is stretched, so a fleet's watches do not end in step."""
    return max(1, watch_timeout // 10)


def read_timeout_for(watch_timeout: int) -> int:
    """The client's read timeout of a watch: beyond the longest server timeout."""
    return watch_timeout + _jitter(watch_timeout) + max(1, watch_timeout // 2)


def liveness_bound(watch_timeout: int) -> float:
    """Longest time a silently dead watch goes unnoticed (then a list starts over)."""
    return float(read_timeout_for(watch_timeout))


def backoff_wait(backoff: float) -> float:
    """The wait before the next list: a random point in [backoff / 2, backoff]."""
    return backoff * (0.5 + random.random() / 2)


class Informer:
    """One kind's list-then-watch loop on a thread of its own.

    ``list_call`` is a generated list function with its fixed arguments bound (a
    namespace, a selector); it is called with ``_preload_content=False`` for the
    list and ``watch=True`` for the watch. Each object reaches ``_deliver`` as
    ("SYNC", body) from a list and (ADDED|MODIFIED|DELETED, body) from a watch;
    after every complete list ``_listed`` gets the keys it held, so a subclass can
    tell what was deleted while no watch was there to say so.
    """

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        *,
        page: int = LIST_PAGE,
        watch_timeout: int = 20,
        list_timeout: float = LIST_TIMEOUT,
        on_view_restored: Callable[[], None] | None = None,
        on_view_lost: Callable[[], None] | None = None,
        on_heard: Callable[[], None] | None = None,
    ) -> None:
        if watch_timeout < 1:
            raise ValueError(f"watch_timeout must be at least 1 s, got {watch_timeout}")
        if page < 1:
            raise ValueError(f"page must be at least 1, got {page}")
        self.name = name
        self.list_call = list_call
        self.page = page
        # Called after the first list and after every list that follows a failure:
        # from then on the view is continuous again (a routine watch timeout is not
        # a gap).
        self.on_view_restored = on_view_restored
        # Called when the watch or a list fails: the view has a gap from then until
        # the list that restores it.
        self.on_view_lost = on_view_lost
        # Called whenever the stream proves alive (an event, a bookmark, a watch that
        # ended on time). The server ends each watch after ``watch_timeout`` (plus a
        # tenth at most, jitter) and the client gives up reading half that again
        # later, so a connection that died silently is noticed within
        # ``liveness_bound(watch_timeout)``, not at a default read timeout of
        # minutes: whoever acts on this view must not trust it longer.
        self.on_heard = on_heard
        self.watch_timeout = watch_timeout
        self.read_timeout = read_timeout_for(watch_timeout)
        self.list_timeout = list_timeout
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-informer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # Wakes the thread blocked reading the watch; a response not reading (yet,
            # or any more) raises, and the stop flag ends the thread instead.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                response.shutdown()
        if self._thread.ident is not None:  # stopped before it started: nothing to join
            self._thread.join(timeout)

    # -- what a subclass gives --------------------------------------------------------

    def _deliver(self, event_type: str, raw: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _listed(self, keys: set[str]) -> None:
        """A list ended; ``keys`` are every object it held."""

    def _list_began(self) -> None:
        """A list starts (its items follow as SYNC deliveries, then ``_listed``)."""

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        gap = True
        while not self._stop.is_set():
            try:
                version = self._list(restored=gap)
                gap = False
                # Watch from the list, then from the last event seen, until the server
                # says the version is too old (list again) or the stream breaks.
                at_once = False
                while version is not None and not self._stop.is_set():
                    began = time.monotonic()
                    version, events = self._watch_once(version)
                    quick = time.monotonic() - began < SHORTEST_HEALTHY_WATCH
                    at_once = version is not None and not events and quick
                    if at_once:
                        break
                    failures = 0
                if self._stop.is_set():
                    return
                # Events were missed: a gap like a failure's until the next list ends.
                gap = True
                if self.on_view_lost is not None:
                    self.on_view_lost()
                if not at_once:  # too old to resume (410 Gone): list again at once
                    log.info("%s watch: its resourceVersion is too old; listing again", self.name)
                    continue
                reason = "the watch ended at once"
            except Exception as e:  # ApiException, OSError, urllib3 protocol errors...
                gap = True
                if self._stop.is_set():
                    return
                if self.on_view_lost is not None:
                    self.on_view_lost()
                reason = f"{type(e).__name__}: {api_error_line(e)}"
            failures += 1
            wait = backoff_wait(capped_doubling(failures, BACKOFF_START, MAX_BACKOFF))
            log.warning("%s watch: %s; listing again in %.1fs", self.name, reason, wait)
            self._stop.wait(wait)

    def _list(self, *, restored: bool) -> str | None:
        keys: set[str] = set()
        token: str | None = None
        self._list_began()
        while True:
            extra = {"_continue": token} if token else {}
            response = self.list_call(
                limit=self.page,
                _preload_content=False,
                _request_timeout=self.list_timeout,
                **extra,
            )
            listed = json.loads(response.data)
            for item in listed.get("items") or ():
                keys.add(key_of(item))
                self._deliver("SYNC", item)
            meta = listed.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self._listed(keys)
        self.synced.set()
        if restored and self.on_view_restored is not None:
            self.on_view_restored()
        self._heard()
        return str(meta.get("resourceVersion") or "") or None

    def _watch_once(self, version: str) -> tuple[str | None, int]:
        """One watch from ``version``: the version to resume from (None: list again)
        and how many events and bookmarks it brought."""
        timeout = self.watch_timeout + random.randint(0, _jitter(self.watch_timeout))
        self._response = response = self.list_call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(self.list_timeout, self.read_timeout),
        )
        events = 0
        try:
            for line in watch_lines(response):
                if self._stop.is_set():
                    return None, events
                if not line or line.isspace():
                    continue
                event = json.loads(line)
                kind, raw = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return None, events  # typically 410 Gone: list again
                version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
                events += 1
                if kind != "BOOKMARK":
                    self._deliver(kind, raw)
                self._heard()
        finally:
            self._response = None
            if self._stop.is_set():
                response.close()
            else:
                response.release_conn()
        self._heard()  # ended on time: the server was there to end it
        return version, events

    def _heard(self) -> None:
        if self.on_heard is not None:
            self.on_heard()


class LeaseInformer(Informer):
    """The agents' node Leases in ``namespace``, as ``LeaseRecord``s."""

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
        leases: Any = client.CoordinationV1Api(api)

        def list_call(**kwargs: Any) -> Any:
            return leases.list_namespaced_lease(namespace, label_selector=label_selector, **kwargs)

        super().__init__(
            "lease",
            list_call,
            watch_timeout=watch_timeout,
            on_view_restored=on_view_restored,
            on_view_lost=on_view_lost,
            on_heard=on_heard,
        )
        self.on_event = on_event
        self._known: set[str] = set()

    def _deliver(self, event_type: str, raw: Mapping[str, Any]) -> None:
        record = lease_record_of(raw)
        if event_type == "DELETED":
            self._known.discard(record.name)
        else:
            self._known.add(record.name)
        self.on_event(event_type, record)

    def _listed(self, keys: set[str]) -> None:
        names = {split_key(key)[1] for key in keys}  # one namespace: names suffice
        for gone in self._known - names:  # deleted while no watch was there to say so
            self.on_event("DELETED", LeaseRecord(gone, None, None, 0, ""))
        self._known = names


class ObjectInformer(Informer):
    """Every object of one of sandlot's kinds in the cluster, as the API server's
    JSON; ``on_event`` runs on this informer's thread, ``on_listed`` after each
    complete list with its keys ("namespace/name")."""

    def __init__(
        self,
        api: client.ApiClient,
        plural: str,
        on_event: RawCallback,
        on_listed: Callable[[set[str]], None],
        *,
        watch_timeout: int = 60,
        page: int = LIST_PAGE,
    ) -> None:
        custom: Any = client.CustomObjectsApi(api)

        def list_call(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(GROUP, VERSION, plural, **kwargs)

        super().__init__(plural, list_call, page=page, watch_timeout=watch_timeout)
        self.on_event = on_event
        self.on_listed = on_listed

    def _deliver(self, event_type: str, raw: Mapping[str, Any]) -> None:
        self.on_event(event_type, raw)

    def _listed(self, keys: set[str]) -> None:
        self.on_listed(keys)


class SandboxInformer(ObjectInformer):
    """Every Sandbox, for the operator's sandbox cache."""

    def __init__(
        self,
        api: client.ApiClient,
        on_event: RawCallback,
        on_listed: Callable[[set[str]], None],
        *,
        watch_timeout: int = 60,
        page: int = LIST_PAGE,
    ) -> None:
        super().__init__(
            api, SANDBOXES, on_event, on_listed, watch_timeout=watch_timeout, page=page
        )
        self.name = "sandbox"
