"""The controllers that place and keep sandboxes, bundled for the operator program:
the sandbox cache they share, the scheduler, the pool controller and its router,
the lifetime controller and the claim controller.

``operator.build_parts`` builds one ``Workloads``, feeds it the agents' Lease events,
tells it about leadership, and runs its workers; ``register`` adds its kopf
handlers (watch-only ``on.event``: nothing is written to the watched objects).

Every controller here acts only as the leader *and* once its caches are synced:
the sandbox cache and the claim informer have taken in their first complete list,
and kopf has handed over every pool and SandboxNode (``kopflisted``). Before that,
a restarted leader would see pools short of members (and create more), Services
without endpoints (and empty their slices), claims whose sandbox is gone (and
write them Lost) and nodes with room (and bind beyond their capacity). What came
due meanwhile is dropped by the queues; the moment the caches are synced, a leader
re-judges everything, as on taking over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from sandlot.adapters.agentsandboxapi import AgentSandboxApi
from sandlot.adapters.objects import Objects
from sandlot.adapters.workloads import WorkloadApi
from sandlot.api.common import CLAIMS, KUBE_NODES, NODES, POOLS
from sandlot.controllers import agentsandbox as agentsandbox_module
from sandlot.controllers import pools as pools_module
from sandlot.controllers import scheduler as scheduler_module
from sandlot.controllers.agentsandbox import AgentSandboxController
from sandlot.controllers.claims import ClaimController
from sandlot.controllers.kopflisted import KopfListed
from sandlot.controllers.lifetimes import LifetimeController
from sandlot.controllers.liveness import LivenessView
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.pools import PoolController
from sandlot.controllers.routing import Router
from sandlot.controllers.sandboxes import SandboxCache
from sandlot.controllers.scheduler import Scheduler
from sandlot.controllers.settings import OperatorSettings

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]


@dataclass
class Workloads:
    cache: SandboxCache
    scheduler: Scheduler
    pools: PoolController
    lifetimes: LifetimeController
    claims: ClaimController
    listed: KopfListed
    is_leader: Callable[[], bool]
    agent_sandbox: AgentSandboxController | None = None
    """agent-sandbox's face (settings.agent_sandbox): its objects over these."""

    @classmethod
    def build(
        cls,
        settings: OperatorSettings,
        objects: Objects,
        metrics: WorkloadMetrics,
        *,
        is_leader: Callable[[], bool],
        post_event: EventPoster,
        liveness: LivenessView,
    ) -> Workloads:
        cache = SandboxCache()

        def acting() -> bool:
            return built.synced() and is_leader()

        api = WorkloadApi(objects)
        scheduler = Scheduler(api, cache, metrics, is_leader=acting, liveness=liveness)
        pools = PoolController(
            api,
            cache,
            Router(objects, metrics),
            metrics,
            is_leader=acting,
            post_event=post_event,
            resync_interval=settings.resync_interval,
            node_ready=scheduler.node_ready,
            max_replicas=settings.pool_max_replicas,
        )
        lifetimes = LifetimeController(api, cache, is_leader=acting)
        claims = ClaimController(api, cache, pools, is_leader=acting, metrics=metrics)
        listed = KopfListed(
            {
                POOLS: lambda: pools.seen,
                NODES: lambda: scheduler.seen_nodes,
                KUBE_NODES: lambda: scheduler.seen_kube_nodes,
            },
            api.listed_keys,
            on_listed=lambda: built.on_synced(),
        )
        compat = (
            AgentSandboxController(AgentSandboxApi(objects), cache, is_leader=acting)
            if settings.agent_sandbox
            else None
        )
        built = cls(cache, scheduler, pools, lifetimes, claims, listed, is_leader, compat)
        cache.on_synced.append(built.on_synced)
        claims.on_synced.append(built.on_synced)
        return built

    def synced(self) -> bool:
        return self.cache.synced and self.claims.synced and not self.listed.pending

    def on_synced(self) -> None:
        """The last cache is synced: a leader re-judges everything, as on taking over."""
        if self.synced():
            self.on_leadership(self.is_leader())

    def register(self, registry: kopf.OperatorRegistry) -> None:
        scheduler_module.register(registry, self.scheduler)
        pools_module.register(registry, self.pools)
        if self.agent_sandbox is not None:
            agentsandbox_module.register(registry, self.agent_sandbox)

    def unsynced(self) -> list[str]:
        """The caches whose first list is not in yet (the readiness probe names them)."""
        unsynced = [] if self.cache.synced else ["sandboxes"]
        unsynced += [] if self.claims.synced else [CLAIMS]
        return unsynced + self.listed.unlisted()

    def on_leadership(self, leader: bool) -> None:
        """On the loop: a new leader re-judges everything from its warm caches."""
        if leader:
            self.scheduler.enqueue_all()
            self.pools.on_leadership()
            self.lifetimes.enqueue_all()
            self.claims.enqueue_all()
            if self.agent_sandbox is not None:
                self.agent_sandbox.enqueue_all()

    async def run(self) -> None:
        self.scheduler.bind_loop(asyncio.get_running_loop())
        await asyncio.gather(
            self.listed.run(),
            self.scheduler.run(),
            self.pools.run(),
            self.lifetimes.run(),
            self.claims.run(),
            *([self.agent_sandbox.run()] if self.agent_sandbox is not None else []),
        )
