"""An API-server comeback at fleet scale kills no live work, against a real API
server: 1,200 nodes renew their Leases throughout, while the operator's path to the
API server is cut for lease + grace + 30 s and then comes back congested, so its
re-list of the Leases arrives a page at a time, seconds apart.

Nodes on the pages not received yet still hold their renewals from before the cut.
If the first page's items counted as a fresh view, the guard would lift once two
pages had renewed and the last page's nodes would be reaped live. Dead is terminal,
so one look at the end says whether any live sandbox was ever marked.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench.scalefleet import Agents, create_nodes, create_sandboxes
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.controlplane import ControlPlane
from tests.support.kube import start_private_plane
from tests.support.netfault import SeveringRelay, relayed_kubeconfig
from tests.support.operator import OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

NS, LEASE_NS = "relist", "relist-leases"
NODES = 1200  # three pages of the operator's 500-item Lease list
LEASE, GRACE = 20, 5
RENEW_EVERY = 8.0  # 150 renewals a second across the fleet
OUTAGE = LEASE + GRACE + 30  # seconds: the fault itself, not a wait
# Bytes a second per connection once the path is back: a page of 500 Leases
# (about 300 kB) takes about 15 s, three grace periods.
CONGESTED = 20_000
RECONCILES = "sandlot_operator_node_reconcile_duration_seconds_count"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = start_private_plane(tmp_path / "cp", namespaces=(NS, LEASE_NS))
    yield plane
    plane.stop()


def _readyz(op: OperatorProcess) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _phases(objs: Any, plural: str, namespace: str | None = None) -> dict[str, int]:
    if namespace is None:
        listed = objs.list_cluster_custom_object(GROUP, VERSION, plural)
    else:
        listed = objs.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    counts: dict[str, int] = {}
    for item in listed["items"]:
        phase = (item.get("status") or {}).get("phase", "")
        counts[phase] = counts.get(phase, 0) + 1
    return counts


def _dead_nodes(objs: Any) -> list[str]:
    listed = objs.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes")
    return [
        item["spec"]["nodeName"]
        for item in listed["items"]
        if (item.get("status") or {}).get("phase") == "Dead"
    ]


def test_a_congested_comeback_after_an_outage_marks_no_live_sandbox_dead(
    plane: ControlPlane, tmp_path: Path
) -> None:
    kubeconfig = str(plane.kubeconfig)
    objs = client.CustomObjectsApi(load_api_client(kubeconfig, pool_size=8))
    names = [f"n{i:04d}" for i in range(NODES)]
    create_nodes(kubeconfig, names)
    agents = Agents(kubeconfig, LEASE_NS, names, tmp_path, RENEW_EVERY, LEASE)
    relay = SeveringRelay(plane.apiserver_port).start()
    op: OperatorProcess | None = None
    try:
        create_sandboxes(kubeconfig, NS, [(f"sb-{n}", n) for n in names])
        relayed = tmp_path / "relayed-kubeconfig"
        relayed_kubeconfig(plane, relay, relayed)
        op = OperatorProcess(
            plane, tmp_path, LEASE_NS, "--grace-period", f"{GRACE}s", kubeconfig=relayed
        )
        op.wait_metrics(timeout=60)
        wait_for(
            lambda: _phases(objs, "sandboxnodes").get("Ready") == NODES,
            timeout=240,
            interval=1,
            what=f"all {NODES} nodes Ready",
        )
        wait_for(lambda: _readyz(op) == 200, timeout=60, what="the operator ready")

        relay.cut()
        cut_at = time.monotonic()
        wait_for(
            lambda: _readyz(op) != 200,
            timeout=60,
            interval=0.5,
            what="the operator to notice the cut (not ready)",
        )
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - cut_at)))
        before = op.metric(RECONCILES)
        relay.restore(downstream_rate=CONGESTED)
        wait_for(
            lambda: _readyz(op) == 200,
            timeout=400,
            interval=1,
            what="the operator ready again (its lists in through the congested path)",
        )
        # It judged every node again, through at least a lease and a grace period
        # after its view came back.
        judged = op.metric(RECONCILES) + NODES
        wait_for(
            lambda: op.metric(RECONCILES) >= judged,
            timeout=120,
            interval=1,
            what=f"{NODES} node reconciles after the view came back",
        )
        assert op.metric(RECONCILES) > before
        time.sleep(LEASE + GRACE)  # a window to act in: whatever it would mark, it marks
        # A node whose own renewals lapsed past its lease (its renewer starved, or the
        # API server too slow to take the patch) was not live then: marking it is
        # right. Every other node was live throughout, and none of those may be Dead.
        lapsed = agents.lapsed(LEASE)
        assert len(lapsed) < NODES // 20, (
            f"the rig could not keep the fleet renewing: {len(lapsed)} of {NODES} nodes "
            f"went over {LEASE}s without a renewal (longest {max(lapsed.values())}s)"
        )
        dead = _dead_nodes(objs)
        live_marked = sorted(set(dead) - set(lapsed))
        assert not live_marked, (
            f"live sandboxes marked Dead on {len(live_marked)} nodes, first {live_marked[:5]} "
            f"(phases {_phases(objs, 'sandboxes', NS)}; nodes whose renewals lapsed: {lapsed})"
        )
        phases = _phases(objs, "sandboxes", NS)
        assert phases.get("Running", 0) + len(dead) == NODES, phases
    finally:
        if op is not None:
            op.stop()
        relay.close()
        agents.stop()
