"""The scheduler and the pool controller over one fake API, one sandbox cache and a
fake clock, fed the watch events the API server would send."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from sandlot.adapters.objects import LeaseRecord
from sandlot.api.common import API_VERSION
from sandlot.api.timestamps import rfc3339
from sandlot.controllers.liveness import LivenessView
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.pools import PoolController
from sandlot.controllers.routing import Router
from sandlot.controllers.sandboxes import SandboxCache
from sandlot.controllers.scheduler import Scheduler
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

LEASE = 40


@dataclass
class Taken:
    """The keys a step's queues took, in order: sandboxes the scheduler judged, pools
    the pool controller reconciled, claims the claim controller did."""

    sandboxes: list[str] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)

    def __iadd__(self, other: Taken) -> Taken:
        self.sandboxes += other.sandboxes
        self.pools += other.pools
        self.claims += other.claims
        return self


class WorkloadWorld:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.objects = FakeObjects(self.clock.now)
        self.cache = SandboxCache(wall=self.clock.now)
        self.leader = True
        self.events: list[tuple[str, str]] = []  # (object name, reason)
        self.metrics = WorkloadMetrics(CollectorRegistry())
        self.liveness = LivenessView(
            self.clock.now,
            unseen_duration=timedelta(seconds=LEASE),
            staleness_bound=timedelta(seconds=LEASE),
        )
        self.scheduler = Scheduler(
            self.objects,  # type: ignore[arg-type]
            self.cache,
            self.metrics,
            is_leader=lambda: self.leader,
            clock=self.clock.now,
            queue_clock=self.clock.monotonic,
            liveness=self.liveness,
        )
        self.pools = PoolController(
            self.objects,  # type: ignore[arg-type]
            self.cache,
            Router(self.objects, self.metrics),  # type: ignore[arg-type]
            self.metrics,
            is_leader=lambda: self.leader,
            post_event=lambda body, _t, reason, _m: self.events.append(
                (body["metadata"]["name"], reason)
            ),
            queue_clock=self.clock.monotonic,
            clock=self.clock.now,
            node_ready=self.scheduler.node_ready,
            pass_rest=0.0,  # a step runs every pass due; the rest is tested on the queue
        )
        self.created = self.clock.now() - timedelta(hours=1)
        self._delivered: dict[str, str] = {}

    # -- the world ------------------------------------------------------------------

    def node(self, name: str, capacity: int, *, ready: bool = True) -> None:
        body = self.objects.add_node(name, self.created)
        body["status"] = {"capacity": {"sandboxes": capacity}}
        self.objects.nodes[name] = copy.deepcopy(body)
        self.scheduler.on_node(None, body)
        if ready:
            self.renew(name)

    def capacity(self, name: str, capacity: int) -> None:
        body = self.objects.nodes[name]
        body["status"]["capacity"] = {"sandboxes": capacity}
        self.objects.touch(body)
        self.scheduler.on_node("MODIFIED", copy.deepcopy(body))

    def renew(self, name: str) -> None:
        self.liveness.on_lease_record(
            "MODIFIED",
            LeaseRecord(
                name=name,
                holder=name,
                renew_time=self.clock.now(),
                duration_seconds=LEASE,
                resource_version="1",
            ),
        )

    def sandbox(self, name: str, namespace: str = "ns") -> str:
        body = self.objects.add_sandbox(namespace, name, self.clock.now())
        self.cache.on_event(None, body)
        return f"{namespace}/{name}"

    def pool(self, name: str, replicas: int, namespace: str = "ns", **spec: Any) -> str:
        body = {
            "apiVersion": API_VERSION,
            "kind": "SandboxPool",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"pool-uid-{name}",
                "generation": 1,
                "resourceVersion": "p1",
                "creationTimestamp": rfc3339(self.created),
            },
            "spec": {
                "replicas": replicas,
                "template": {"spec": {"image": "registry.example/app:1"}},
                **spec,
            },
            "status": {},
        }
        self.objects.pools[f"{namespace}/{name}"] = body
        self.pools.on_pool(None, copy.deepcopy(body))
        return f"{namespace}/{name}"

    def scale(self, key: str, replicas: int) -> None:
        body = self.objects.pools[key]
        body["spec"]["replicas"] = replicas
        body["metadata"]["generation"] += 1
        self.objects.touch(body)
        self.pools.on_pool("MODIFIED", copy.deepcopy(body))

    def end(self, key: str, phase: str = "Dead") -> None:
        """The sandbox ends (its agent, or node health, writes a terminal phase)."""
        body = self.objects.sandboxes[key]
        body["status"] = {"phase": phase, "finishedAt": rfc3339(self.clock.now())}
        self.objects.touch(body)

    # -- running ----------------------------------------------------------------------

    def step(self) -> Taken:
        """Run both queues until nothing is due, delivering sandbox events in between;
        the keys they took (a test asserting that nothing happened first asserts that
        what it names was looked at)."""
        taken = Taken()
        for _ in range(20):
            taken.sandboxes += asyncio.run(self.scheduler.queue.run_until_idle())
            taken.pools += asyncio.run(self.pools.queue.run_until_idle())
            if not self._deliver() and not len(self.scheduler.queue) and not len(self.pools.queue):
                return taken
        raise AssertionError("the controllers did not settle within 20 rounds")

    def _deliver(self) -> bool:
        changed = False
        for key, body in list(self.objects.sandboxes.items()):
            rv = body["metadata"]["resourceVersion"]
            if self._delivered.get(key) != rv:
                self._delivered[key] = rv
                self.cache.on_event("MODIFIED", copy.deepcopy(body))
                changed = True
        for key in [k for k in self._delivered if k not in self.objects.sandboxes]:
            ns, name = key.split("/", 1)
            gone = self.cache.get(key)
            del self._delivered[key]
            if gone is not None:
                meta = {"namespace": ns, "name": name, "uid": gone.uid}
                self.cache.on_event("DELETED", {"metadata": meta})
            changed = True
        return changed

    # -- reading ------------------------------------------------------------------------

    def bound(self, key: str) -> str | None:
        node: str | None = self.objects.sandboxes[key]["spec"].get("nodeName")
        return node

    def condition(self, key: str, type_: str) -> dict[str, Any] | None:
        status = self.objects.sandboxes[key].get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)

    def members(self, pool_key: str) -> list[str]:
        ns, name = pool_key.split("/", 1)
        return sorted(
            k
            for k, b in self.objects.sandboxes.items()
            if k.startswith(f"{ns}/")
            and (b["metadata"].get("labels") or {}).get("sandlot.dev/pool") == name
        )
