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
- The agent's own writes are seen at once: ``observe`` puts the object a write
  returned into the map when it is newer than what the watch last brought
  (resourceVersions ordered as KEP-5504 defines), and tells listeners as an event
  would (as ``WRITTEN``, so the agent's sync can tell its own write from anyone
  else's); the watch's echo of that write, no newer, then changes nothing. A pass
  woken by finished work so sees that work, without a 409 and a re-read for a
  write it made itself (client-go's mutation cache does the same for controllers).
- The list, watch, resume and back-off are the operator's informers' own loop
  (``adapters.informer.Informer``): a watch that ends at its ``timeout_seconds``
  resumes from the last resourceVersion seen (bookmarks keep it current), so no
  LIST is spent on it; any error, a 410 Gone among them, starts over with a fresh
  LIST. The map is swapped whole when that LIST ends, never emptied on the way,
  so a reader never mistakes a reconnect for "every sandbox was deleted".
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
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from sandlot.adapters.informer import Informer, liveness_bound, read_timeout_for
from sandlot.api.common import CACHEPRUNES, GROUP, NODES, SANDBOXES, SNAPSHOTS, VERSION, key_of
from sandlot.api.resourceversion import newer
from sandlot.policy.agentsync import WRITTEN

__all__ = ["WatchCache", "cache_prunes", "liveness_bound", "node_sandboxes", "node_snapshots",
           "own_node",
           "read_timeout_for"]  # fmt: skip

log = logging.getLogger(__name__)

LIST_TIMEOUT = 30.0
WATCH_TIMEOUT = 30

# (event, old body or None, new body or None). Events: ADDED, MODIFIED, DELETED from
# the watch, LISTED (old and new None) after every fresh LIST replaced the map, and
# WRITTEN for an object the agent's own write returned (``observe``).
ChangeCallback = Callable[[str, Mapping[str, Any] | None, Mapping[str, Any] | None], None]


class WatchCache(Informer):
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
        custom: Any = client.CustomObjectsApi(api)
        selected = {"field_selector": field_selector} if field_selector else {}

        def list_call(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(GROUP, VERSION, plural, **selected, **kwargs)

        super().__init__(
            name or plural, list_call, watch_timeout=watch_timeout, list_timeout=list_timeout
        )
        self.plural = plural
        self.field_selector = field_selector
        self.on_change = on_change
        self.lists = 0  # LISTs that filled the map (the first one, then one per restart)
        self._objects: dict[str, dict[str, Any]] = {}
        self._filling: dict[str, dict[str, Any]] = {}  # the LIST in progress
        self._lock = threading.Lock()

    def start(self, on_change: ChangeCallback | None = None) -> None:
        """List and watch from now on. ``on_change``, when given here, replaces the
        one given at construction: a listener built from parts made after this cache
        (the agent's sync, which reads it) is handed over before any change can come."""
        if on_change is not None:
            self.on_change = on_change
        super().start()

    # -- readers

    def items(self) -> list[dict[str, Any]]:
        """The latest body of every object, as of the last event received."""
        with self._lock:
            return list(self._objects.values())

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(key)

    # -- what the informer delivers

    def _list_began(self) -> None:
        self._filling = {}

    def _listed(self, keys: set[str]) -> None:
        with self._lock:
            for key, listed in self._filling.items():  # a write seen after the LIST's read
                held = self._objects.get(key)
                if held is not None and newer(_version(held), _version(listed)):
                    self._filling[key] = held
            self._objects, self._filling = self._filling, {}
        self.lists += 1
        self._notify("LISTED", None, None)

    def _deliver(self, event_type: str, raw: Mapping[str, Any]) -> None:
        key = key_of(raw)
        if event_type == "SYNC":
            self._filling[key] = dict(raw)
            return
        with self._lock:
            old = self._objects.get(key)
            if event_type == "DELETED":
                self._objects.pop(key, None)
            elif old is not None and newer(_version(raw), _version(old)) is False:
                return  # the echo of a write ``observe`` already put here, or older
            else:
                self._objects[key] = dict(raw)
        self._notify(event_type, old, None if event_type == "DELETED" else raw)

    def observe(self, written: Mapping[str, Any]) -> bool:
        """Hold ``written`` (an object as a write to the API server returned it) if it
        is newer than the watch's latest, telling listeners (event ``WRITTEN``: their
        own write, on the writer's thread); True if it was. When the watch brought that
        very version first, listeners are told it was this write (``old`` and ``new``
        then carry the same version) and nothing changes. An object the map does not
        hold yet is left to the watch."""
        key = key_of(written)
        with self._lock:
            old = self._objects.get(key)
            if old is None:
                return False
            echoed = _version(written) == _version(old)
            if not echoed:
                if not newer(_version(written), _version(old)):
                    return False
                self._objects[key] = dict(written)
        self._notify(WRITTEN, old, written)
        return not echoed

    def _notify(
        self, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(event, old, new)
        except Exception:  # a listener's bug must not end the watch
            log.exception("%s watch: change listener failed on %s", self.name, event)


def _version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


def node_sandboxes(api: client.ApiClient, node: str, **kwargs: Any) -> WatchCache:
    """The Sandboxes bound to ``node`` (server-side: ``spec.nodeName``), by ``ns/name``."""
    return WatchCache(
        api, SANDBOXES, field_selector=f"spec.nodeName={node}", name="sandboxes", **kwargs
    )


def node_snapshots(api: client.ApiClient, node: str, **kwargs: Any) -> WatchCache:
    """The SandboxSnapshots bound to ``node`` (server-side: ``spec.nodeName``)."""
    return WatchCache(
        api, SNAPSHOTS, field_selector=f"spec.nodeName={node}", name="snapshots", **kwargs
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
