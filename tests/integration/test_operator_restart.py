"""A leader killed outright and a new one started, whose first list of the fleet's
sandboxes takes seconds: until that list is in, the new leader acts on nothing.

The fleet is thousands of sandboxes; the new operator reaches the API server
through a relay that slows every response to a trickle, so its first Sandbox list
takes many seconds while the small ones (its leader Lease, the pools, the claims)
arrive at once. Meanwhile, every 50 ms, the pools' EndpointSlices and the claims
are read: no ready endpoint goes, no claim leaves Bound, no member is created, and
a Pending sandbox is not bound to nodes that are full. Then the new leader is seen
to have acted (a pool pass, the Pending sandbox judged unschedulable), so nothing
above held only because nothing ran.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Leases
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import CLAIM_LABEL, POOL_LABEL
from sandlot.devtools.controlplane import ControlPlane
from tests.support.kube import start_private_plane
from tests.support.netfault import SeveringRelay, relayed_kubeconfig
from tests.support.operator import Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

NS = "work"
LEASE_NS = "sandlot-system"
FILLERS = 3000  # sandboxes outside any pool, listed before the pools' members
POOLS = 3
REPLICAS = 4
# Bytes a second the relay lets through to the new operator, per connection: its
# first Sandbox list (a few MB) takes well over ten seconds.
TRICKLE = 250_000
SAMPLE_EVERY = 0.05
PENDING = "a-0-pending"  # sorts first: the new leader sees it long before its nodes' load
NOTE = "x" * 600  # makes each filler's body, and so the list, larger
ADDRESSES = itertools.count()


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = start_private_plane(tmp_path / "cp", namespaces=(NS, LEASE_NS))
    yield plane
    plane.stop()


def objs(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def fill(fleet: Fleet, nodes: list[str], count: int = FILLERS) -> None:
    def one(i: int) -> None:
        name = f"a-fill-{i:05d}"
        objs(fleet.api).create_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": name, "annotations": {"test.sandlot.dev/note": NOTE}},
                "spec": {"image": "example.test/busybox:1", "nodeName": nodes[i % len(nodes)]},
            },
        )
        fleet.set_phase(name, "Running", ip=f"10.66.{i // 250}.{i % 250 + 1}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(count)))


def create_pool(api: client.ApiClient, name: str) -> None:
    objs(api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxpools",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxPool",
            "metadata": {"name": name},
            "spec": {
                "replicas": REPLICAS,
                "serviceName": f"svc-{name}",
                "template": {
                    "spec": {
                        "image": "example.test/app:1",
                        "ports": [{"name": "http", "containerPort": 8080}],
                    }
                },
            },
        },
    )


def create_claim(api: client.ApiClient, name: str, pool: str) -> None:
    objs(api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxclaims",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"poolName": pool},
        },
    )


def start_scheduled_members(api: client.ApiClient) -> None:
    """What agents would do: a pool member bound to a node starts Running with an IP."""
    members = objs(api).list_namespaced_custom_object(
        GROUP, VERSION, NS, "sandboxes", label_selector=POOL_LABEL
    )["items"]
    for m in members:
        phase = (m.get("status") or {}).get("phase")
        if m["spec"].get("nodeName") and phase in (None, "Pending", "Scheduled"):
            n = next(ADDRESSES)
            objs(api).patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                NS,
                "sandboxes",
                m["metadata"]["name"],
                {"status": {"phase": "Running", "ip": f"10.77.{n // 250}.{n % 250 + 1}"}},
            )


def ready_endpoints(api: client.ApiClient) -> dict[str, int]:
    """Ready endpoints per Service, over its sandlot EndpointSlices."""
    found: dict[str, int] = {}
    for es in client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(NS).items:
        assert es.metadata is not None
        service = (es.metadata.labels or {}).get("kubernetes.io/service-name", "")
        ready = sum(1 for e in es.endpoints or () if e.conditions and e.conditions.ready)
        found[service] = found.get(service, 0) + ready
    return found


def claims(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    items = objs(api).list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxclaims")["items"]
    return {c["metadata"]["name"]: c.get("status") or {} for c in items}


def steady(api: client.ApiClient) -> bool:
    start_scheduled_members(api)
    if ready_endpoints(api) != {f"svc-p{i}": REPLICAS for i in range(POOLS)}:
        return False
    return all(s.get("phase") == "Bound" for s in claims(api).values())


def placed_fleet(api: client.ApiClient) -> list[dict[str, Any]] | None:
    """Every sandbox, once the fleet has settled after the claims, else None.

    ``steady`` can hold a moment too early for counting load per node: a claim is
    Bound as soon as its member was taken, and the pool's replacement for it is
    created, then scheduled, then started after that, while the Service's slice can
    still count the member that left. So this waits, on one listing, for what the
    test then counts: each pool back at ``REPLICAS`` Running members, and every
    sandbox not finished on a node."""
    if not steady(api):
        return None
    listed: list[dict[str, Any]] = objs(api).list_namespaced_custom_object(
        GROUP, VERSION, NS, "sandboxes"
    )["items"]
    live = [
        sb
        for sb in listed
        if (sb.get("status") or {}).get("phase") not in ("Dead", "Stopped", "Failed")
    ]
    if any(not sb["spec"].get("nodeName") for sb in live):
        return None
    running: dict[str, int] = {}
    for sb in live:
        pool = (sb["metadata"].get("labels") or {}).get(POOL_LABEL)
        if pool is not None and (sb.get("status") or {}).get("phase") == "Running":
            running[pool] = running.get(pool, 0) + 1
    return listed if running == {f"p{i}": REPLICAS for i in range(POOLS)} else None


def readyz(op: OperatorProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/readyz", timeout=2) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode().strip()
    except OSError as e:
        return 0, str(e)


class Sampler:
    """Reads the Services' ready endpoints and the claims every ``SAMPLE_EVERY``."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.min_ready: dict[str, int] = {}
        self.left_bound: list[tuple[str, dict[str, Any]]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for service, ready in ready_endpoints(self.api).items():
                self.min_ready[service] = min(ready, self.min_ready.get(service, ready))
            for name, status in claims(self.api).items():
                if status.get("phase") != "Bound":
                    self.left_bound.append((name, status))
            self.samples += 1
            self._stop.wait(SAMPLE_EVERY)


def test_a_new_leader_acts_only_once_its_first_list_of_the_fleet_is_in(
    plane: ControlPlane, tmp_path: Path
) -> None:
    api = load_api_client(str(plane.kubeconfig), pool_size=32)
    fleet = Fleet(api, NS, LEASE_NS)
    nodes = [fleet.node("n1"), fleet.node("n2")]
    for node in nodes:
        fleet.lease(node, duration=10)
        objs(api).patch_cluster_custom_object_status(
            GROUP, VERSION, "sandboxnodes", node, {"status": {"capacity": {"sandboxes": 5000}}}
        )
    fill(fleet, nodes)

    first = OperatorProcess(plane, tmp_path, LEASE_NS)
    relay = SeveringRelay(plane.apiserver_port, downstream_rate=TRICKLE).start()
    second: OperatorProcess | None = None
    sampler: Sampler | None = None
    try:
        first.wait_metrics(timeout=60)
        wait_for(first.is_leader, timeout=60, what="the first operator to lead")
        for i in range(POOLS):
            create_pool(api, f"p{i}")
        wait_for(lambda: steady(api), timeout=90, what="every pool's members Running and routed")
        for i in range(POOLS):
            create_claim(api, f"c{i}", f"p{i}")
        listed = wait_for(
            lambda: placed_fleet(api),
            timeout=90,
            interval=0.5,
            what="every claim Bound, every pool full again and every sandbox on a node",
        )
        bound = {name: status["sandboxName"] for name, status in claims(api).items()}
        # Every node full: a sandbox that wants a node must wait.
        load = {node: 0 for node in nodes}
        for sb in listed:
            if (sb.get("status") or {}).get("phase") not in ("Dead", "Stopped", "Failed"):
                load[sb["spec"]["nodeName"]] += 1
        for node, count in load.items():
            objs(api).patch_cluster_custom_object_status(
                GROUP, VERSION, "sandboxnodes", node, {"status": {"capacity": {"sandboxes": count}}}
            )
        before = {sb["metadata"]["name"] for sb in listed}

        sampler = Sampler(api).start()
        first.kill()
        objs(api).create_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": PENDING},
                "spec": {"image": "example.test/busybox:1"},
            },
        )
        # The next leader is started once the dead one's Lease has expired. It leads
        # once it has seen that Lease unchanged for a lease duration on its own clock
        # (it cannot trust another host's renewTime), and its first list of the
        # sandboxes, slowed by the relay, is still arriving then.
        leases = Leases(api, LEASE_NS)

        def expired() -> bool:
            lease = leases.get("sandlot-operator")
            assert lease is not None and lease.renew_time is not None
            return lease.renew_time + timedelta(seconds=lease.duration_seconds) < datetime.now(UTC)

        wait_for(expired, timeout=30, interval=0.2, what="the killed leader's Lease to expire")
        relayed = tmp_path / "relayed-kubeconfig"
        relayed_kubeconfig(plane, relay, relayed)
        second = OperatorProcess(plane, tmp_path, LEASE_NS, kubeconfig=relayed)
        second.wait_metrics(timeout=60)
        wait_for(second.is_leader, timeout=30, what="the new operator to lead")
        led_at = time.monotonic()
        unsynced_while_leading = readyz(second)
        wait_for(
            lambda: readyz(second)[0] == 200,
            timeout=180,
            interval=0.5,
            what="the new leader to be ready (its first lists in)",
        )
        listing_took = time.monotonic() - led_at

        def judged() -> bool:
            pending = fleet.get(PENDING)
            conditions = (pending.get("status") or {}).get("conditions") or ()
            return any(c["type"] == "Scheduled" for c in conditions)

        wait_for(judged, timeout=30, what=f"the new leader to judge where {PENDING} goes")
        wait_for(
            lambda: second.metric("sandlot_operator_pool_reconcile_duration_seconds_count") > 0,
            timeout=30,
            what="the new leader's first pool pass",
        )
        time.sleep(2)  # a few more samples after its passes
        sampler.stop()

        assert sampler.samples > 100, f"only {sampler.samples} samples taken"
        assert sampler.min_ready == {f"svc-p{i}": REPLICAS for i in range(POOLS)}, (
            f"ready endpoints dropped during the restart: lowest seen {sampler.min_ready}"
        )
        assert not sampler.left_bound, f"claims left Bound: {sampler.left_bound[:3]}"
        assert {n: s["sandboxName"] for n, s in claims(api).items()} == bound
        after = {
            sb["metadata"]["name"]
            for sb in objs(api).list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes")[
                "items"
            ]
        }
        assert after - before == {PENDING}, f"sandboxes created: {sorted(after - before)}"
        assert second.metric("sandlot_operator_pool_members_created_total") == 0
        assert not fleet.get(PENDING)["spec"].get("nodeName"), f"{PENDING} was bound to a full node"
        for sb in objs(api).list_namespaced_custom_object(
            GROUP, VERSION, NS, "sandboxes", label_selector=CLAIM_LABEL
        )["items"]:
            assert sb["status"]["phase"] == "Running"
        # The window was real: the new leader led for seconds before its list was in.
        assert unsynced_while_leading[0] == 503, unsynced_while_leading
        assert "caches not synced" in unsynced_while_leading[1], unsynced_while_leading
        assert listing_took > 3, f"the first list took only {listing_took:.1f}s"
    finally:
        if sampler is not None:
            sampler.stop()
        for op in (first, second):
            if op is not None:
                op.stop()
        relay.close()
        fleet.cleanup()
        api.close()
