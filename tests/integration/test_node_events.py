"""No SandboxNode event is lost, against the real API server: not after a status
write that changed nothing, and not behind a kopf watch that died silently."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import client, watch
from prometheus_client import CollectorRegistry

from sandlot.adapters.kube import connection_params, load_api_client
from sandlot.adapters.objects import Objects
from sandlot.api.common import GROUP, VERSION
from sandlot.controllers.kopfwiring import KOPF_WATCH_CLIENT_SECONDS, register_kopf
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.nodehealth import NodeHealthController
from sandlot.controllers.settings import OperatorSettings
from sandlot.devtools.controlplane import ControlPlane
from sandlot.policy.nodehealth import NodeHealthSettings
from tests.support.netfault import SeveringRelay, relayed_kubeconfig
from tests.support.operator import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

NODES = "sandboxnodes"
# kopf's old bound on a silent watch was its inactivity timeout (70 s): well past this.
NOTICED_WITHIN = KOPF_WATCH_CLIENT_SECONDS + 15


def rv(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["resourceVersion"])


class NodeWatch:
    """A real watch of one SandboxNode; its events queued for the test to hand on."""

    def __init__(self, api: client.ApiClient, name: str, since: str) -> None:
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._watch = watch.Watch()
        objs = client.CustomObjectsApi(api)
        self._stream = self._watch.stream(
            objs.list_cluster_custom_object,
            GROUP,
            VERSION,
            NODES,
            field_selector=f"metadata.name={name}",
            resource_version=since,
            timeout_seconds=60,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for event in self._stream:
                self.events.put((event["type"], event["object"]))
        except Exception:  # stopped: the test asks for no more events
            return

    def next(self, what: str, timeout: float = 10) -> tuple[str, dict[str, Any]]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no watch event within {timeout}s: {what}")

    def stop(self) -> None:
        self._watch.stop()


def test_a_status_write_that_changed_nothing_leaves_the_node_cache_taking_events(
    kube: client.ApiClient, fleet: Fleet
) -> None:
    """The controller's own write path (``_write``) with the real API's answers: a
    write identical to what is stored keeps its resourceVersion and makes no event."""
    objs: Any = client.CustomObjectsApi(kube)
    name = fleet.node("echo")
    listed = objs.get_cluster_custom_object(GROUP, VERSION, NODES, name)
    ctl = NodeHealthController(
        OperatorSettings(
            leader_election=False,
            node_health=NodeHealthSettings(grace_period=timedelta(minutes=5)),
        ),
        Objects(kube),
        OperatorMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        post_event=lambda *_: None,
    )
    ctl.on_node(None, listed)
    events = NodeWatch(kube, name, rv(listed))
    try:
        assert asyncio.run(ctl._write(name, {"sandboxes": 7}))
        written = rv(objs.get_cluster_custom_object(GROUP, VERSION, NODES, name))
        assert written != rv(listed), "the first write must change the node"
        kind, echo = events.next("the echo of the first write")
        assert (kind, rv(echo)) == ("MODIFIED", written)
        ctl.on_node(kind, echo)

        assert asyncio.run(ctl._write(name, {"sandboxes": 7}))  # the same again
        assert rv(objs.get_cluster_custom_object(GROUP, VERSION, NODES, name)) == written, (
            "the API server must keep the version of a write that changed nothing"
        )

        # A drain flag set after it must reach the cache.
        objs.patch_cluster_custom_object(
            GROUP, VERSION, NODES, name, {"spec": {"unschedulable": True}}
        )
        kind, drained = events.next("the drain's event")
        assert drained["spec"]["unschedulable"] is True
        ctl.on_node(kind, drained)
        assert rv(ctl.nodes[name]) == rv(drained), (
            "the node cache dropped the drain's event: it still awaits the echo of a "
            "write that changed nothing"
        )
        assert ctl.reads[name].unschedulable
    finally:
        events.stop()


@pytest.fixture
def relayed(control_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[SeveringRelay, Any]]:
    relay = SeveringRelay(control_plane.apiserver_port).start()
    path = tmp_path / "relay-kubeconfig"
    relayed_kubeconfig(control_plane, relay, path)
    yield relay, load_api_client(str(path))
    relay.close()


def test_a_drain_flag_behind_a_silently_dead_kopf_watch_is_seen_within_its_bound(
    kube: client.ApiClient, fleet: Fleet, relayed: tuple[SeveringRelay, Any]
) -> None:
    """kopf configured as the operator configures it, through a relay whose open
    connections then go silent: the SandboxNode watch must be replaced within the
    client bound, not at kopf's inactivity timeout."""
    relay, api = relayed
    name = fleet.node("silent")
    seen: dict[str, bool] = {}
    registry = kopf.OperatorRegistry()
    register_kopf(registry, connection_params(api))

    @kopf.on.event(GROUP, VERSION, NODES, registry=registry)
    def on_node(body: Any, **_: Any) -> None:
        if body["metadata"]["name"] == name:
            seen["unschedulable"] = bool(body.get("spec", {}).get("unschedulable"))
            seen["watched"] = "watched" in (body["metadata"].get("labels") or {})

    stop = threading.Event()
    runner = threading.Thread(
        target=lambda: asyncio.run(
            kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)
        ),
        daemon=True,
    )
    runner.start()
    try:
        wait_for(lambda: "unschedulable" in seen, timeout=30, what="kopf listed the node")
        # A change made after the listing reaches kopf only through its watch: once
        # it arrives, the watch is the connection the relay silences.
        objs: Any = client.CustomObjectsApi(kube)
        objs.patch_cluster_custom_object(
            GROUP, VERSION, NODES, name, {"metadata": {"labels": {"watched": "yes"}}}
        )
        wait_for(lambda: seen.get("watched"), timeout=30, what="kopf's watch delivered the label")
        assert relay.sever_silently() > 0, "kopf made no connection through the relay"
        objs.patch_cluster_custom_object(
            GROUP, VERSION, NODES, name, {"spec": {"unschedulable": True}}
        )
        began = time.monotonic()
        wait_for(
            lambda: seen.get("unschedulable"),
            timeout=NOTICED_WITHIN,
            what="the drain flag through a new watch after the old one died silently",
        )
        assert time.monotonic() - began <= NOTICED_WITHIN
    finally:
        stop.set()
        runner.join(timeout=30)
    assert not runner.is_alive(), "kopf did not stop within 30 s"
