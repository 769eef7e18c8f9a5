"""The agent's view of its sandlot objects, kept current by list + watch instead of
a LIST per pass.

A fleet of 500 agents each listing its sandboxes every second is 500 LISTs a second
on the API server for nothing. Here each agent lists once, then watches from the
list's resourceVersion with the same field selector (``spec.nodeName`` is a
selectable field of the Sandbox CRD, so the server filters), and keeps the latest
body of every object in memory. An idle node then costs the API server one open
watch per kind and no request at all.

Trade-offs:

- The map can lag the server by the time an event takes to arrive. Whoever acts
  on it destructively on a stale view (tearing down the container of a sandbox
  that looks unstarted) re-reads the object first; everything else either writes
  with the object's resourceVersion (a stale view gets a 409 and re-reads) or is
  harmless to repeat.
- A watch that ends at its ``timeout_seconds`` resumes from the last
  resourceVersion seen (bookmarks keep it current), so no LIST is spent on it. Any
  error, a 410 Gone among them, starts over with a fresh LIST after a capped
  backoff; the map is swapped whole when that LIST returns, never emptied on the
  way, so a reader never mistakes a reconnect for "every sandbox was deleted".
- Every call is bounded: the LIST by ``_request_timeout``, the watch by
  ``timeout_seconds`` on the server and a client read timeout half that again
  beyond it. A watch whose connection died silently (a peer gone without a FIN, a
  dropped NAT entry, an API server that was frozen) sends nothing, not even its
  end: the read timeout is what notices it, so ``watch_timeout`` bounds how stale
  the agent's view can get (``liveness_bound``), and it is kept well below the
  operator's lease + grace so the agent hears of a fence, a deletion or a new
  sandbox long before anything could be reaped for the silence.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from sandlot.adapters.objects import CACHEPRUNES, NODES, SANDBOXES
from sandlot.api.common import GROUP, VERSION

log = logging.getLogger(__name__)

LIST_TIMEOUT = 30.0
WATCH_TIMEOUT = 30
BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
# A stream that ends this soon without an event is treated as a failure, so a server
# that closes watches at once is not asked again in a tight loop.
SHORTEST_HEALTHY_WATCH = 1.0

# (event, old body or None, new body or None). Events: ADDED, MODIFIED, DELETED from
# the watch, and LISTED (old and new None) after every fresh LIST replaced the map.
ChangeCallback = Callable[[str, Mapping[str, Any] | None, Mapping[str, Any] | None], None]


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for a namespaced object, ``name`` for a cluster-scoped one."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _jitter(watch_timeout: int) -> int:
    """Most a watch's server timeout is stretched, so a fleet's watches do not end in step."""
    return max(1, watch_timeout // 10)


def read_timeout_for(watch_timeout: int) -> int:
    """The client's read timeout of a watch: beyond the longest server timeout."""
    return watch_timeout + _jitter(watch_timeout) + max(1, watch_timeout // 2)


def liveness_bound(watch_timeout: int) -> float:
    """Longest time a silently dead watch goes unnoticed (then a LIST starts over)."""
    return float(read_timeout_for(watch_timeout))


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


class WatchCache:
    """Every object of one sandlot kind the field selector admits, by key.

    ``synced`` is set once the first LIST has filled the map; until then the map
    says nothing (an empty map before it is not "no objects"). ``on_change`` runs
    on the watch thread for every change and after every LIST: keep it cheap (set
    an event, compare two fields).
    """

    def __init__(
        self,
        api: client.ApiClient,
        plural: str,
        *,
        field_selector: str | None = None,
        on_change: ChangeCallback | None = None,
        name: str | None = None,
        watch_timeout: int = WATCH_TIMEOUT,
        list_timeout: float = LIST_TIMEOUT,
    ) -> None:
        self.custom: Any = client.CustomObjectsApi(api)
        self.plural = plural
        self.field_selector = field_selector
        self.on_change = on_change
        self.name = name or plural
        if watch_timeout < 1:
            raise ValueError(f"watch_timeout must be at least 1 s, got {watch_timeout}")
        self.watch_timeout = watch_timeout
        self.read_timeout = read_timeout_for(watch_timeout)
        self.list_timeout = list_timeout
        self.synced = threading.Event()
        self.lists = 0  # LISTs that filled the map (the first one, then one per restart)
        self._objects: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.name}", daemon=True)

    # -- readers

    def items(self) -> list[dict[str, Any]]:
        """The latest body of every object, as of the last event received."""
        with self._lock:
            return list(self._objects.values())

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(key)

    # -- lifecycle

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the watch (its socket is shut, so a blocked read returns at once)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        # Repeated: a stream opened just as the flag was set would otherwise block
        # until its server-side timeout.
        while self._thread.is_alive() and time.monotonic() < deadline:
            current = self._watch
            if current is not None:
                current.stop()
            self._thread.join(0.1)

    # -- the loop

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    def _list(self) -> str:
        listed = self.custom.list_cluster_custom_object(
            GROUP, VERSION, self.plural, _request_timeout=self.list_timeout, **self._kwargs()
        )
        fresh = {object_key(item): dict(item) for item in listed.get("items", [])}
        with self._lock:
            self._objects = fresh
        self.lists += 1
        self.synced.set()
        self._notify("LISTED", None, None)
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _notify(
        self, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(event, old, new)
        except Exception:  # a listener's bug must not end the watch
            log.exception("%s watch: change listener failed on %s", self.name, event)

    def _apply(self, event: str, obj: Mapping[str, Any]) -> None:
        key = object_key(obj)
        with self._lock:
            old = self._objects.get(key)
            if event == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = dict(obj)
        self._notify(event, old, None if event == "DELETED" else obj)

    def _stream(self, resource_version: str) -> tuple[str, int]:
        """Watch from ``resource_version`` until the server ends the stream; returns
        the last resourceVersion seen and the number of events."""
        timeout = self.watch_timeout + random.randint(0, _jitter(self.watch_timeout))
        self._watch = watch.Watch()
        events = 0
        for event in self._watch.stream(
            self.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            self.plural,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _request_timeout=(LIST_TIMEOUT, self.read_timeout),
            **self._kwargs(),
        ):
            if self._stop.is_set():
                break
            obj = event.get("raw_object") or event.get("object") or {}
            resource_version = _resource_version(obj) or resource_version
            events += 1
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(event["type"], obj)
        return resource_version, events

    def _run(self) -> None:
        backoff = BACKOFF_START
        resource_version = ""
        while not self._stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list()
                began = time.monotonic()
                resource_version, events = self._stream(resource_version)
                if events or time.monotonic() - began >= SHORTEST_HEALTHY_WATCH:
                    backoff = BACKOFF_START
                    continue  # the server's timeout: resume from where it ended
                reason = "the watch ended at once"
            except ApiException as exc:
                resource_version = ""
                if exc.status == 410:
                    reason = "its resourceVersion is too old (410 Gone)"
                else:
                    reason = f"{exc.status} {exc.reason}"
            except Exception as exc:  # connection resets, urllib3 protocol errors
                resource_version = ""
                reason = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            log.warning("%s watch: %s; listing again in %.1fs", self.name, reason, backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_CAP)


def node_sandboxes(api: client.ApiClient, node: str, **kwargs: Any) -> WatchCache:
    """The Sandboxes bound to ``node`` (server-side: ``spec.nodeName``), by ``ns/name``."""
    return WatchCache(
        api, SANDBOXES, field_selector=f"spec.nodeName={node}", name="sandboxes", **kwargs
    )


def own_node(api: client.ApiClient, node: str, **kwargs: Any) -> WatchCache:
    """The SandboxNode ``node`` alone (``metadata.name``), for its drain flag."""
    return WatchCache(
        api, NODES, field_selector=f"metadata.name={node}", name="sandboxnode", **kwargs
    )


def cache_prunes(api: client.ApiClient, **kwargs: Any) -> WatchCache:
    """Every CachePrune: few, short-lived, and the nodes they name are a list, which no
    field selector can match."""
    return WatchCache(api, CACHEPRUNES, name="cacheprunes", **kwargs)
