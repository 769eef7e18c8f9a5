"""The CachePrune controller: resolves a request's targets and answers for the
nodes whose agent never will, so nobody waits forever.

Agents write their own results; this controller only fills ``status.targets``,
writes an error result for a target that does not exist or whose agent's lease
has run out, and keeps ``status.phase`` in step with the results. Decisions come
from ``sandlot.policy.cacheprune``; the status write carries the request's
resourceVersion, so it never overwrites a result an agent wrote meanwhile.

It runs on kopf events (a request created or answered, a SandboxNode changed)
and on a short resync of the requests still open, which covers what no event
announces: a drained node's lease running out, and a new leader taking over
requests its predecessor left. No timer or finalizer sits on CachePrunes, so
deleting one never waits for the operator. Only the leader acts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import kopf

from sandlot.adapters.cacheprune import CachePrunes, Conflict, agent_lease_expiries
from sandlot.adapters.objects import Objects
from sandlot.api.cacheprune import CachePrune, CachePrunePhase, CachePruneStatus, NodePruneResult
from sandlot.api.common import CACHEPRUNES, GROUP, NODES, VERSION
from sandlot.api.node import NodePhase
from sandlot.api.timestamps import utcnow
from sandlot.controllers.kopfhandlers import resync_while_operating
from sandlot.controllers.ownwork import CoalescedRuns
from sandlot.policy.cacheprune import TERMINAL_PRUNE_PHASES, NodeReach, PruneDecision, decide

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
RESYNC_SECONDS = 5.0


def _node_phase(body: Mapping[str, Any]) -> NodePhase | None:
    raw = (body.get("status") or {}).get("phase")
    try:
        return NodePhase(raw) if raw else None
    except ValueError:
        return None


class CachePruneController:
    def __init__(
        self,
        objects: Objects,
        lease_namespace: str,
        leading: Callable[[], bool],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.objects = objects
        self.prunes = CachePrunes(objects.api)
        self.lease_namespace = lease_namespace
        self.leading = leading
        self.clock = clock
        self.phases: dict[str, str | None] = {}
        """Last seen phase of every request (from events): the open ones get resynced."""
        self.runs = CoalescedRuns(
            self.reconcile, leading, kind="CachePrune", task_prefix="cacheprune", log=log
        )

    # -- inputs --------------------------------------------------------------------

    def on_request(self, event_type: str, body: Mapping[str, Any]) -> None:
        name = body["metadata"]["name"]
        if event_type == "DELETED":
            self.phases.pop(name, None)
            return
        self.phases[name] = (body.get("status") or {}).get("phase")
        self.kick(name)

    def kick_open(self) -> None:
        for name, phase in list(self.phases.items()):
            if phase not in TERMINAL_PRUNE_PHASES:
                self.kick(name)

    def kick(self, name: str) -> None:
        """Reconcile ``name`` soon; coalesces while one reconcile of it runs."""
        self.runs.kick(name)

    # -- the work (synchronous: runs in a thread) ---------------------------------

    def reconcile(self, name: str) -> PruneDecision | None:
        """Read the request, decide, write the status if it changes. None when gone."""
        for _ in range(MAX_ATTEMPTS):
            raw = self.prunes.get_raw(name)
            if raw is None:
                return None
            request = CachePrune.model_validate(raw)
            status = request.status or CachePruneStatus()
            stored_phase = (raw.get("status") or {}).get("phase")
            results = {node: r.error for node, r in status.results.items()}
            now = self.clock()
            resolved = stored_phase not in (None, CachePrunePhase.PENDING)
            waiting = [t for t in status.targets if t not in results]
            nodes: dict[str, NodeReach] = {}
            if not resolved or waiting:
                expiries = agent_lease_expiries(self.objects.api, self.lease_namespace)
                for body in self.objects.list_nodes():
                    node = body["metadata"]["name"]
                    nodes[node] = NodeReach(_node_phase(body), expiries.get(node))
            decision = decide(
                all_=request.spec.all,
                spec_nodes=request.spec.nodes,
                current_phase=stored_phase,
                current_targets=status.targets,
                results=results,
                nodes=nodes,
                now=now,
            )
            if not decision.changes(stored_phase, status.targets):
                return decision
            patch: dict[str, Any] = {"phase": decision.phase, "targets": list(decision.targets)}
            if decision.errors:
                patch["results"] = {
                    node: NodePruneResult.model_validate(
                        {"pass": decision.pass_kind, "error": reason, "completed_at": now}
                    ).wire()
                    for node, reason in decision.errors.items()
                }
            try:
                self.prunes.patch_status(name, patch, raw["metadata"]["resourceVersion"])
            except Conflict:
                continue  # an agent answered meanwhile: decide again on what it wrote
            for reason in decision.errors.values():
                log.info("CachePrune %s: %s", name, reason)
            if decision.phase != stored_phase:
                log.info(
                    "CachePrune %s is %s (targets: %s)", name, decision.phase, decision.targets
                )
            self.phases[name] = decision.phase
            return decision
        raise RuntimeError(f"CachePrune {name} kept changing for {MAX_ATTEMPTS} attempts")


def register(
    registry: kopf.OperatorRegistry,
    objects: Objects,
    leading: Callable[[], bool],
    lease_namespace: str,
) -> CachePruneController:
    """Add the CachePrune handlers to ``registry``."""
    controller = CachePruneController(objects, lease_namespace, leading)

    @kopf.on.event(GROUP, VERSION, CACHEPRUNES, registry=registry)
    async def cacheprune_event(body: kopf.Body, **kwargs: Any) -> None:
        controller.on_request(kwargs.get("type") or "MODIFIED", body)

    @kopf.on.event(GROUP, VERSION, NODES, registry=registry)
    async def cacheprune_node_event(**_: Any) -> None:
        controller.kick_open()

    resync_while_operating(
        registry, controller.kick_open, leading, interval=RESYNC_SECONDS, name="cacheprune_resync"
    )

    return controller


__all__ = ["CachePruneController", "register"]
