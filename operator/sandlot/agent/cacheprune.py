"""Image GC passes and CachePrune answers: run what ``policy.agentprune`` says is
this node's to answer, record the GC state on the SandboxNode, write the result.

Requests come from a watch (``adapters.sandboxwatch.cache_prunes``); until its
first LIST the map is empty, which is not "no requests", so nothing is answered.

The GC state goes to the SandboxNode as a JSON merge patch, which keeps every
field it does not name: a backoff that cleared is written as an explicit null,
or the old ``exhaustedUntil`` would stay and a restarted agent, which restores it
at start, would mute its automatic passes again until that time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sandlot.adapters.agentapi import patch_cacheprune_result
from sandlot.adapters.objects import Objects
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.agent.imagegc import GcResult, ImageCollector
from sandlot.api.timestamps import rfc3339
from sandlot.policy.agentprune import (
    PruneAnswer,
    PruneRequest,
    answers_to_remember,
    prunes_to_answer,
)

log = logging.getLogger(__name__)


def gc_status_patch(result: GcResult) -> dict[str, Any]:
    """``SandboxNode.status`` merge patch for a pass: ``exhaustedUntil`` null when unset."""
    gc = result.to_node_gc_status().wire()
    gc.setdefault("exhaustedUntil", None)
    return {"gc": gc}


@dataclass(eq=False)
class CacheUpkeep:
    """The automatic GC pass and CachePrune answers of one node."""

    objects: Objects
    node: str
    prune_watch: WatchCache
    collector: ImageCollector
    clock: Callable[[], datetime]
    # The watch shows an answer only once its event is back: until then this set
    # keeps a request from running twice. Bounded by the requests that exist.
    answered: set[str] = field(default_factory=set, init=False)

    def record_gc(self, result: GcResult) -> None:
        if not result.ran:
            return
        try:
            self.objects.patch_node_status(self.node, gc_status_patch(result))
        except Exception as exc:
            log.warning("cannot record GC state in SandboxNode %s: %s", self.node, exc)

    def gc_once(self) -> None:
        self.record_gc(self.collector.run_automatic())

    def prune_once(self) -> int:
        """Answer CachePrune requests for this node that it has not answered yet."""
        if not self.prune_watch.synced.is_set():
            return 0
        requests = [PruneRequest.from_object(r) for r in self.prune_watch.items()]
        self.answered = answers_to_remember(self.answered, requests)
        due = prunes_to_answer(requests, self.node, self.answered)
        for answer in due:
            log.info("CachePrune %s: running the %s pass", answer.name, answer.pass_kind)
            body = self._answer(answer)
            patch_cacheprune_result(self.objects, answer.name, self.node, body)
            self.answered.add(answer.uid)
        return len(due)

    def _answer(self, answer: PruneAnswer) -> dict[str, Any]:
        if answer.error is not None:
            return {
                "pass": answer.pass_kind,
                "error": answer.error,
                "completedAt": rfc3339(self.clock()),
            }
        result = self.collector.run(answer.pass_kind)
        self.record_gc(result)
        return result.to_prune_result(self.clock()).wire()


__all__ = ["CacheUpkeep", "gc_status_patch"]
