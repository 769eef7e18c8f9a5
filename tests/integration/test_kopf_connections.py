"""kopf's connections to the API server are bounded, against the real API server.

A first install meets every SandboxNode at once, and kopf adds its finalizer to each
one it has not seen before. With kopf's built-in session (no connection limit) each
of those patches in flight opened a TLS connection of its own: 798 at once on 5,000
nodes, and the operator's heap kept what their buffers took. The operator now logs
kopf in with a session of at most ``KOPF_CONNECTIONS`` connections.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.kopfclient import KOPF_CONNECTIONS
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import NODE_HEALTH_FINALIZER
from sandlot.devtools.controlplane import ControlPlane
from tests.support.operator import Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

NODES = 400
# The operator's own client besides kopf's: its node status writes run on asyncio's
# default executor (min(32, cores + 4) threads, a connection each at most), two
# Event threads, two informers' watches, the leader election and the metrics and
# health listeners.
OWN_CONNECTIONS = min(32, (os.cpu_count() or 1) + 4) + 8


def sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:  # closed between the listing and the read
            continue
    return count


def test_a_first_install_on_many_new_nodes_holds_a_bounded_number_of_connections(
    kube: client.ApiClient,
    fleet: Fleet,
    control_plane: ControlPlane,
    tmp_path: Path,
    lease_namespace: str,
) -> None:
    with ThreadPoolExecutor(16) as pool:
        names = list(pool.map(lambda i: fleet.node(f"fresh-{i:03d}", lease=False), range(NODES)))
    objs: Any = client.CustomObjectsApi(kube)

    def finalized() -> int:
        items = objs.list_cluster_custom_object(GROUP, VERSION, "sandboxnodes")["items"]
        mine = set(names)
        return sum(
            1
            for item in items
            if item["metadata"]["name"] in mine
            and NODE_HEALTH_FINALIZER in (item["metadata"].get("finalizers") or [])
        )

    assert finalized() == 0
    op = OperatorProcess(
        control_plane, tmp_path, lease_namespace, "--grace-period", "1h", "--resync-interval", "30s"
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        # From the moment the process exists: kopf's burst starts with its first listing.
        nonlocal peak
        while not done.is_set() and op.proc.poll() is None:
            try:
                peak = max(peak, sockets(op.proc.pid))
            except OSError:
                return
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        op.wait_metrics()
        wait_for(
            lambda: finalized() == NODES,
            timeout=120,
            what=f"kopf's finalizer on all {NODES} new nodes",
        )
    finally:
        done.set()
        sampler.join(5)
        op.stop()
    assert peak > 0, "the sampler never read the operator's sockets"
    assert peak <= KOPF_CONNECTIONS + OWN_CONNECTIONS, (
        f"the operator held {peak} sockets at once while kopf finalized {NODES} new nodes; "
        f"kopf's bound is {KOPF_CONNECTIONS}, the operator's own client at most {OWN_CONNECTIONS}"
    )
