"""Which CachePrune requests this node's agent answers: a pure decision.

A request is this node's to answer when it names the node (or names none, meaning
every node), has no result from it yet, and the agent did not answer it already
(its own answer reaches the watched view only an event later, so the agent keeps
the uids it answered until the request is gone). A request resolved before the
node registered (no longer Pending, and the node not among its fixed targets) is
not: nobody waits for that answer, and the operator's phase would never count it.

A request for a cache other than containerd's is answered at once with an error
naming the target, rather than left waiting.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sandlot.api.cacheprune import CachePrunePhase
from sandlot.policy.imagegc import PassKind, pass_for_request

CONTAINERD_TARGET = "containerd"


@dataclass(frozen=True)
class PruneRequest:
    """What the agent reads of a CachePrune request."""

    uid: str
    name: str
    nodes: tuple[str, ...] = ()
    """``spec.nodes``; empty means every node."""
    answered_by: frozenset[str] = frozenset()
    """Nodes with a result in ``status.results``."""
    phase: str | None = None
    targets: tuple[str, ...] = ()
    """``status.targets``: the nodes fixed when the request was resolved."""
    all: bool = False
    target: str = CONTAINERD_TARGET

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PruneRequest:
        meta = obj["metadata"]
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return cls(
            uid=str(meta.get("uid")),
            name=str(meta["name"]),
            nodes=tuple(spec.get("nodes") or ()),
            answered_by=frozenset(status.get("results") or {}),
            phase=status.get("phase"),
            targets=tuple(status.get("targets") or ()),
            all=bool(spec.get("all")),
            target=str(spec.get("target", CONTAINERD_TARGET)),
        )


@dataclass(frozen=True)
class PruneAnswer:
    """A request to answer now: run ``pass_kind``, or report ``error`` without running."""

    uid: str
    name: str
    pass_kind: PassKind
    error: str | None = None


def _due(request: PruneRequest, node: str) -> bool:
    if (request.nodes and node not in request.nodes) or node in request.answered_by:
        return False
    return request.phase in (None, CachePrunePhase.PENDING) or node in request.targets


def prunes_to_answer(
    requests: Iterable[PruneRequest], node: str, answered: Collection[str]
) -> list[PruneAnswer]:
    """The requests ``node`` answers now, in order; ``answered``: uids it answered already."""
    out: list[PruneAnswer] = []
    for request in requests:
        if request.uid in answered or not _due(request, node):
            continue
        error = (
            None if request.target == CONTAINERD_TARGET else f"unknown target {request.target!r}"
        )
        out.append(PruneAnswer(request.uid, request.name, pass_for_request(request.all), error))
    return out


def answers_to_remember(answered: Collection[str], requests: Iterable[PruneRequest]) -> set[str]:
    """The answered uids still worth keeping: those of requests that still exist."""
    return set(answered) & {r.uid for r in requests}


__all__ = [
    "CONTAINERD_TARGET",
    "PruneAnswer",
    "PruneRequest",
    "answers_to_remember",
    "prunes_to_answer",
]
