"""An informer stopped before it was started (a process shut down while it still
waited for containerd, or failed to bind a port) stops without an error."""

from __future__ import annotations

from kubernetes import client

from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.api.common import SANDBOXES


def test_a_watch_stopped_before_it_started_stops_quietly() -> None:
    watch = WatchCache(client.ApiClient(client.Configuration()), SANDBOXES)
    watch.stop(timeout=1)
    assert not watch.synced.is_set()
    assert watch.lists == 0
