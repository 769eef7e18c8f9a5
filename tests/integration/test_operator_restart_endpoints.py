"""A leader killed outright and a new one started: every EndpointSlice event from
before the kill until well after the new leader's first passes is watched, and no
endpoint of a member that was Ready before the kill ever leaves, not even for one
write a sampler could miss.

The fleet's sandboxes fill more than one page of the new operator's first list,
with the pools' members on the last one, so routing from a part of the list would
drop them; the nodes' Leases are short and the grace period shorter, and the watch
runs for a lease duration and a grace period past the new leader's first passes,
so a node the new leader judged NotReady would have its members marked Dead, and
leave the slices, within it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Leases
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from tests.integration.test_operator_restart import (
    LEASE_NS,
    NS,
    POOLS,
    claims,
    create_claim,
    create_pool,
    fill,
    objs,
    placed_fleet,
    readyz,
    steady,
)
from tests.support.kube import start_private_plane
from tests.support.operator import Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

FILLERS = 700  # two pages of the operator's 500-item list; the members sort last
LEASE = 10  # seconds: the nodes' Leases
GRACE = 5  # seconds: node health's grace period
FLAGS = (
    "--grace-period",
    f"{GRACE}s",
    "--agent-lease-duration",
    f"{LEASE}s",
    "--lease-view-max-age",
    "7s",
)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = start_private_plane(tmp_path / "cp", namespaces=(NS, LEASE_NS))
    yield plane
    plane.stop()


def ready_members(api: client.ApiClient) -> tuple[dict[str, dict[str, str]], str]:
    """Each Service's ready endpoints as {Sandbox uid: name}, and the list's version."""
    listed: Any = client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(NS)
    found: dict[str, dict[str, str]] = {}
    for es in listed.items:
        found.setdefault(es.metadata.labels["kubernetes.io/service-name"], {}).update(
            _ready(es.endpoints)
        )
    return found, str(listed.metadata.resource_version)


def _ready(endpoints: Any) -> dict[str, str]:
    return {
        e.target_ref.uid: e.target_ref.name
        for e in endpoints or ()
        if e.conditions and e.conditions.ready and e.target_ref
    }


@dataclass(frozen=True)
class SliceEvent:
    at: float  # monotonic
    kind: str
    service: str
    ready: dict[str, str]  # uid -> name


class SliceWatch:
    """Every EndpointSlice event of ``NS`` from ``resource_version`` on, on a thread,
    watched again from the last version whenever the server ends a watch; a gap (410)
    is recorded, since events lost to it would prove nothing."""

    def __init__(self, api: client.ApiClient, resource_version: str) -> None:
        self.api = api
        self.version = resource_version
        self.events: list[SliceEvent] = []
        self.gaps: list[str] = []
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="slice-watch", daemon=True)

    def start(self) -> SliceWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(40)

    def _run(self) -> None:
        discovery = client.DiscoveryV1Api(self.api)
        while not self._stop.is_set():
            self._watch = watch.Watch()
            try:
                for ev in self._watch.stream(
                    discovery.list_namespaced_endpoint_slice,
                    NS,
                    resource_version=self.version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=10,
                ):
                    es = ev["object"]
                    self.version = es.metadata.resource_version
                    if ev["type"] == "BOOKMARK":
                        continue
                    service = (es.metadata.labels or {}).get("kubernetes.io/service-name", "")
                    ready = {} if ev["type"] == "DELETED" else _ready(es.endpoints)
                    self.events.append(SliceEvent(time.monotonic(), ev["type"], service, ready))
            except ApiException as e:
                if e.status == 410:
                    self.gaps.append(f"watch expired at version {self.version}")
                    return
                self._stop.wait(0.2)
            except Exception:  # a dropped connection: watch again from the last version
                self._stop.wait(0.2)


def test_no_ready_members_endpoint_leaves_its_slice_across_a_leader_restart(
    plane: ControlPlane, tmp_path: Path
) -> None:
    api = load_api_client(str(plane.kubeconfig), pool_size=32)
    fleet = Fleet(api, NS, LEASE_NS)
    nodes = [fleet.node("n1"), fleet.node("n2")]
    for node in nodes:
        fleet.lease(node, duration=LEASE)
        objs(api).patch_cluster_custom_object_status(
            GROUP, VERSION, "sandboxnodes", node, {"status": {"capacity": {"sandboxes": 5000}}}
        )
    fill(fleet, nodes, FILLERS)

    first = OperatorProcess(plane, tmp_path, LEASE_NS, *FLAGS)
    second: OperatorProcess | None = None
    watcher: SliceWatch | None = None
    try:
        first.wait_metrics(timeout=60)
        wait_for(first.is_leader, timeout=60, what="the first operator to lead")
        for i in range(POOLS):
            create_pool(api, f"p{i}")
        wait_for(lambda: steady(api), timeout=90, what="every pool's members Running and routed")
        for i in range(POOLS):
            create_claim(api, f"c{i}", f"p{i}")
        wait_for(
            lambda: placed_fleet(api),
            timeout=90,
            interval=0.5,
            what="every claim Bound, every pool full again and every sandbox on a node",
        )
        before, version = ready_members(api)
        assert sorted(before) == [f"svc-p{i}" for i in range(POOLS)], before
        bound = {name: status["sandboxName"] for name, status in claims(api).items()}
        watcher = SliceWatch(api, version).start()

        first.kill()
        killed = time.monotonic()
        leases = Leases(api, LEASE_NS)

        def expired() -> bool:
            lease = leases.get("sandlot-operator")
            assert lease is not None and lease.renew_time is not None
            return lease.renew_time + timedelta(seconds=lease.duration_seconds) < datetime.now(UTC)

        wait_for(expired, timeout=30, interval=0.2, what="the killed leader's Lease to expire")
        second = OperatorProcess(plane, tmp_path, LEASE_NS, *FLAGS)
        second.wait_metrics(timeout=60)
        wait_for(second.is_leader, timeout=60, what="the new operator to lead")
        wait_for(
            lambda: readyz(second)[0] == 200, timeout=120, interval=0.5, what="the new leader ready"
        )
        # Proof that its routing ran: the first pass of each pool after taking over
        # applies the pool's slice (what it last applied is forgotten on a takeover).
        wait_for(
            lambda: (
                second.metric("sandlot_operator_endpointslice_writes_total", op="apply") >= POOLS
            ),
            timeout=60,
            what="the new leader's first routing pass of every pool",
        )
        wait_for(
            lambda: (
                second.metric("sandlot_operator_node_reconcile_duration_seconds_count")
                >= len(nodes)
            ),
            timeout=60,
            what="the new leader's first pass of every node",
        )
        # The window the fault would need: a node misjudged NotReady now is past its
        # grace, its members marked Dead and out of the slices, by its end.
        time.sleep(LEASE + GRACE + 3)
        watcher.stop()

        assert not watcher.gaps, watcher.gaps
        left = [
            f"{e.at - killed:+.2f}s from the kill: {e.service} {e.kind} without "
            f"{sorted(name for uid, name in before[e.service].items() if uid not in e.ready)}"
            for e in watcher.events
            if e.service in before and not before[e.service].keys() <= e.ready.keys()
        ]
        assert not left, f"ready endpoints left their slice: {left}"
        assert ready_members(api)[0] == before
        assert {n: s["sandboxName"] for n, s in claims(api).items()} == bound
        assert second.metric("sandlot_operator_pool_members_created_total") == 0
        phases = {
            (sb.get("status") or {}).get("phase")
            for sb in objs(api).list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes")[
                "items"
            ]
        }
        assert "Dead" not in phases, phases
    finally:
        if watcher is not None:
            watcher.stop()
        for op in (first, second):
            if op is not None:
                op.stop()
        fleet.cleanup()
        api.close()
