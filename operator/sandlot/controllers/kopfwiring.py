"""kopf as the operator runs it: its settings, its login, and the registry of
every kopf handler (SandboxNode events, the one resync timer per node and node
deletion, and the handlers of the pools, CachePrunes, taint labels, snapshots and
agent certificates). ``controllers.operator.build_parts`` builds the registry;
kopf's own part runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf

from sandlot.adapters.agentcerts import AgentCsrSigner
from sandlot.adapters.kopfclient import kopf_session
from sandlot.api.common import GROUP, KUBE_NODES, VERSION
from sandlot.api.keys import (
    KOPF_ANNOTATION_PREFIX,
    LAST_HANDLED_CONFIGURATION_KEY,
    NODE_HEALTH_FINALIZER,
)
from sandlot.controllers import agentcerts, cacheprune, snapshots, taintlabels
from sandlot.controllers.kopfhandlers import forward_events
from sandlot.controllers.nodehealth import NodeHealthController
from sandlot.controllers.settings import OperatorSettings
from sandlot.controllers.workloads import Workloads

# kopf's start-up listing page, and how long it keeps an object's worker after its
# last event (see ``configure_kopf``).
LIST_PAGE = 500
WORKER_IDLE_SECONDS = 0.1
# A kopf watch that died silently (no FIN, no RST: a dropped NAT entry, a frozen
# peer) delivers nothing, not even its end: the server ends each watch after the
# first bound and kopf gives up on it after the second, so a drain flag is missed
# for at most that long (kopf then watches again from the last version it saw).
KOPF_WATCH_SECONDS = 25
KOPF_WATCH_CLIENT_SECONDS = 35


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf as sandlot runs it (also what ``bench/kopffloor.py`` measures kopf alone with)."""
    settings.peering.standalone = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=KOPF_ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_ANNOTATION_PREFIX, key=LAST_HANDLED_CONFIGURATION_KEY
    )
    settings.persistence.finalizer = NODE_HEALTH_FINALIZER
    settings.posting.level = logging.WARNING
    # kopf logs every handler run at INFO: one line per watch event of every
    # sandbox would cost more than the handlers themselves.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = KOPF_WATCH_SECONDS
    settings.watching.client_timeout = KOPF_WATCH_CLIENT_SECONDS
    settings.networking.request_timeout = 60
    # kopf lists a kind in one response by default: at start-up every existing
    # sandbox's body is held at once, as text and parsed, beside the worker kopf
    # starts per object and keeps until its events have stopped for 5 s. Listing
    # in pages, and letting a worker go once its queue is empty (every handler of
    # ours is an event handler, done at once), bounds the start-up peak by a page.
    settings.watching.chunk_size = LIST_PAGE
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS


def register_kopf(registry: kopf.OperatorRegistry, connection: dict[str, Any]) -> None:
    """kopf's settings as sandlot runs it, and its login as our own client's user."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings)

    # A coroutine: the session it builds belongs to the event loop (kopf runs a
    # plain function in a thread).
    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.AiohttpSession:
        return kopf_session(connection)


def build_registry(
    connection: dict[str, Any],
    settings: OperatorSettings,
    nodehealth: NodeHealthController,
    leading: Callable[[], bool],
    workloads: Workloads,
    snapshot_listeners: Sequence[Callable[[str, Mapping[str, Any]], None]] = (),
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    workloads.register(registry)  # scheduler, pools, routing (watch-only handlers)
    marks = taintlabels.TaintMarks(
        nodehealth.objects,
        taintlabels.KubeNodeView(
            workloads.scheduler.kube_nodes.get, lambda: workloads.listed.has_listed(KUBE_NODES)
        ),
        nodehealth.nodes,
    )

    register_kopf(registry, connection)

    forward_events(
        registry, (GROUP, VERSION, "sandboxnodes"), nodehealth.on_node, name="node_event"
    )

    # A coroutine, as forward_events' handlers are: kopf runs a plain function in a
    # thread, where ``enqueue`` would touch an asyncio queue off its loop.
    @kopf.timer(
        GROUP,
        VERSION,
        "sandboxnodes",
        interval=settings.resync_interval.total_seconds(),
        registry=registry,
    )
    async def resync(name: str, body: kopf.Body, **_: Any) -> None:
        # The one timer per node: kopf's cost grows with timers x nodes, so every
        # controller that resyncs a node does it here.
        nodehealth.enqueue(name)
        if leading():
            await marks.sync(body)

    @kopf.on.delete(GROUP, VERSION, "sandboxnodes", registry=registry)
    async def node_deleted(name: str, body: kopf.Body, **_: Any) -> None:
        if not leading():
            # Only the leader may let the deletion complete (the finalizer goes
            # with success); a standby asks to be called again.
            raise kopf.TemporaryError("not the leader", delay=5)
        try:
            await nodehealth.handle_deleted(name, body)
        except RuntimeError as e:
            raise kopf.TemporaryError(str(e), delay=2) from e

    cacheprune.register(registry, nodehealth.objects, leading, settings.namespace)
    if settings.agent_ca_cert:
        signer = AgentCsrSigner(
            nodehealth.objects.api,
            f"system:serviceaccount:{settings.namespace}:{settings.agent_service_account}",
            settings.agent_ca_cert,
            settings.agent_ca_key,
            settings.agent_cert_lifetime,
        )
        agentcerts.register(registry, signer, leading)
    marks.register(registry, leading)
    snapshots.register(
        registry,
        nodehealth.objects,
        leading,
        workloads.cache,
        listeners=snapshot_listeners,
    )
    return registry
