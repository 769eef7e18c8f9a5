"""Where a sandbox's agent is, remembered a few seconds: a sandbox's node (from its
``spec.nodeName``) and a node's agent (its pod's IP and stream port) change rarely,
and a program's commands one after another should not cost two API reads each.

What is remembered only saves the reads: every connection is still checked as a
fresh one is (the agent's certificate must name the node; the agent serves only
sandboxes it holds). When one remembered is out of date (a sandbox moved, an agent
restarted at another address), the dial fails or the agent answers that the sandbox
is not on its node; the gateway then forgets both and asks again (``forget``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sandlot.api.common import join_key
from sandlot.policy.remembered import Remembered

PLACEMENT_TTL = 5.0
MAX_PLACEMENTS = 10_000


class CachedPlacements:
    """``node_of`` and ``agent_of`` (``gateway.server.Backends``'), each answer kept
    ``ttl`` seconds; a failure raises as theirs do and keeps nothing."""

    def __init__(
        self,
        node_of: Callable[[str, str], str],
        agent_of: Callable[[str], tuple[str, int]],
        *,
        ttl: float = PLACEMENT_TTL,
        max_entries: int = MAX_PLACEMENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node_of = node_of
        self._agent_of = agent_of
        self._nodes: Remembered[str, str] = Remembered(ttl, max_entries)
        self._agents: Remembered[str, tuple[str, int]] = Remembered(ttl, max_entries)
        self._clock = clock
        self._lock = threading.Lock()

    def node_of(self, namespace: str, name: str) -> str:
        key = join_key(namespace, name)
        asked_at = self._clock()
        with self._lock:
            node = self._nodes.answer(key, asked_at)
        if node is None:
            node = self._node_of(namespace, name)
            with self._lock:
                self._nodes.remember(key, node, asked_at)
        return node

    def agent_of(self, node: str) -> tuple[str, int]:
        asked_at = self._clock()
        with self._lock:
            address = self._agents.answer(node, asked_at)
        if address is None:
            address = self._agent_of(node)
            with self._lock:
                self._agents.remember(node, address, asked_at)
        return address

    def forget(self, namespace: str, name: str) -> bool:
        """Forget the sandbox's node and that node's agent; whether either was kept
        (so that asking again may find another answer)."""
        key = join_key(namespace, name)
        with self._lock:
            node = self._nodes.forget(key)
            address = self._agents.forget(node) if node is not None else None
        return node is not None or address is not None


__all__ = ["MAX_PLACEMENTS", "PLACEMENT_TTL", "CachedPlacements"]
