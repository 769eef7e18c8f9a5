"""Nodes lost at once, against the real API server: their passes run side by side.

The controller runs in this process over the real ``Objects`` (the project's own
boundary), so the listing of each lost node can wait at a barrier until every
other lost node's pass has reached its listing too. Passes that ran one at a
time would never meet there: the first would wait out the barrier's deadline.
The Leases are fed to the controller as the watch delivers them.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.objects import LeaseRecord, Objects
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.nodehealth import NodeHealthController
from sandlot.controllers.settings import OperatorSettings
from sandlot.policy.disruption import GuardSettings
from sandlot.policy.nodehealth import NodeHealthSettings
from tests.support.operator import Fleet

pytestmark = pytest.mark.integration

LOST = 4
PER_NODE = 3
BARRIER_WAIT = 20.0


class ListingBarrier(Objects):
    """Objects whose first ``parties`` node listings wait for one another."""

    def __init__(self, api: client.ApiClient, parties: int) -> None:
        super().__init__(api)
        self.barrier = threading.Barrier(parties, timeout=BARRIER_WAIT)
        self.met: list[str] = []
        self.broken: list[str] = []
        self._lock = threading.Lock()

    def node_sandboxes_page(
        self, node: str, limit: int, token: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        with self._lock:
            first = node not in self.met and node not in self.broken
        if first:
            try:
                self.barrier.wait()
                with self._lock:
                    self.met.append(node)
            except threading.BrokenBarrierError:
                with self._lock:
                    self.broken.append(node)
        return super().node_sandboxes_page(node, limit, token)


def test_nodes_lost_at_once_are_marked_in_parallel(kube: client.ApiClient, fleet: Fleet) -> None:
    nodes = [fleet.node(f"burst{i}") for i in range(LOST)]
    sandboxes = [
        fleet.sandbox(f"{node}-{j}", node, "Running") for node in nodes for j in range(PER_NODE)
    ]
    objects = ListingBarrier(kube, parties=LOST)
    settings = OperatorSettings(
        node_health=NodeHealthSettings(
            grace_period=timedelta(seconds=2), unseen_lease_duration=timedelta(seconds=2)
        ),
        lease_view_max_age=timedelta(seconds=2),
        guard=GuardSettings(min_nodes=LOST + 1),  # the guard off: every node here is lost
        leader_election=False,
    )
    ctl = NodeHealthController(
        settings,
        objects,
        OperatorMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        post_event=lambda *_: None,
    )

    async def scenario() -> None:
        runner = asyncio.create_task(ctl.run())
        await asyncio.sleep(0)  # the runner binds its loop
        renewed = datetime.now(UTC)
        for node in nodes:
            ctl.on_node(None, fleet.get_node(node))
            ctl.on_lease("ADDED", LeaseRecord(node, node, renewed, 1, "1"))  # then never again
        ctl.on_view_restored()
        deadline = asyncio.get_running_loop().time() + BARRIER_WAIT + 20
        try:
            while not all(ctl.tracking[n].handled_at for n in nodes):
                assert asyncio.get_running_loop().time() < deadline, (
                    f"lost nodes not all handled within {BARRIER_WAIT + 20:.0f}s: "
                    f"{[n for n in nodes if not ctl.tracking[n].handled_at]}"
                )
                ctl.on_heard()  # the lease watch is alive, it just hears no renewals
                await asyncio.sleep(0.1)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(scenario())
    assert not objects.broken, (
        f"the listings of {objects.broken} waited {BARRIER_WAIT:.0f}s for the other lost "
        "nodes' passes: nodes lost at once were decided one at a time"
    )
    assert sorted(objects.met) == sorted(nodes)
    assert {fleet.phase(sb) for sb in sandboxes} == {"Dead"}
    for node in nodes:
        health = fleet.health(node)
        assert health.get("handledAt"), f"{node}: the latch is not in its status"
        assert health["handledCount"] == PER_NODE
