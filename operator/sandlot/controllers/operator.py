"""The operator program: kopf, embedded (``kopf.operator``), plus leader election
and the agents' Lease watch.

kopf's peering is switched off (``standalone``): every replica runs its handlers
and keeps its caches warm, and only the replica holding the leader Lease acts.
kopf keeps its bookkeeping in annotations, never in sandlot's status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from prometheus_client import REGISTRY, CollectorRegistry

import sandlot
from sandlot.adapters.health import serve_health
from sandlot.adapters.informer import LeaseInformer, SandboxInformer
from sandlot.adapters.kopfclient import kopf_session
from sandlot.adapters.kopfprivate import WatchOnlyMemories, watch_only_kinds
from sandlot.adapters.kube import (
    RequestCounter,
    WriteFence,
    connection_params,
    load_api_client,
    resource_of,
)
from sandlot.adapters.leader import LeaderElector
from sandlot.adapters.objects import Objects, post_event
from sandlot.adapters.startup import require_namespace
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import (
    KOPF_ANNOTATION_PREFIX,
    LAST_HANDLED_CONFIGURATION_KEY,
    NODE_HEALTH_FINALIZER,
)
from sandlot.controllers import cacheprune, pullcredentials, taintlabels
from sandlot.controllers.metrics import OperatorMetrics, WorkloadMetrics
from sandlot.controllers.nodehealth import NodeHealthController
from sandlot.controllers.probes import LoopTicker
from sandlot.controllers.sandboxfeed import SandboxFeed
from sandlot.controllers.settings import OperatorSettings
from sandlot.controllers.workloads import Workloads
from sandlot.policy.probes import Probe

log = logging.getLogger(__name__)

# How long a stopping leader waits for its writes in flight before it gives up
# releasing the Lease early (it then expires by itself).
SHUTDOWN_DRAIN_SECONDS = 5.0
# kopf's start-up listing page, and how long it keeps an object's worker after its
# last event (see ``configure``).
LIST_PAGE = 500
WORKER_IDLE_SECONDS = 0.1
# A kopf watch that died silently (no FIN, no RST: a dropped NAT entry, a frozen
# peer) delivers nothing, not even its end: the server ends each watch after the
# first bound and kopf gives up on it after the second, so a drain flag is missed
# for at most that long (kopf then watches again from the last version it saw).
KOPF_WATCH_SECONDS = 25
KOPF_WATCH_CLIENT_SECONDS = 35
# Loop turns the workers need to create their sub-tasks (workloads -> queue -> workers).
STARTUP_YIELDS = 4


class _CountingMetrics(RequestCounter):
    """Mirrors the client-side request count into a Prometheus counter."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        super().__init__()
        self.metrics = metrics

    def record(self, method: str, url: str) -> None:
        super().record(method, url)
        self.metrics.api_requests.labels(verb=method.upper(), resource=resource_of(url)).inc()

    def record_fenced(self, method: str, url: str) -> None:
        super().record_fenced(method, url)
        self.metrics.writes_fenced.labels(resource=resource_of(url)).inc()

    def record_failure(self, method: str, url: str, code: str) -> None:
        self.metrics.api_failures.labels(
            verb=method.upper(), resource=resource_of(url), code=code
        ).inc()


def event_poster(objects: Objects) -> Callable[[Mapping[str, Any], str, str, str], None]:
    """Post Events off the event loop, best effort: a pass never fails on an Event."""
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="events")

    def post(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        def send() -> None:
            try:
                post_event(
                    objects,
                    body,
                    type_=type_,
                    reason=reason,
                    message=message,
                    component="sandlot-operator",
                )
            except Exception as e:
                log.debug("event %s not posted: %s", reason, e)

        pool.submit(send)

    return post


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
    elector: LeaderElector | None,
    workloads: Workloads | None = None,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    if workloads is not None:
        workloads.register(registry)  # scheduler, pools, routing (watch-only handlers)

    def leading() -> bool:
        return elector is None or elector.leading()

    register_kopf(registry, connection)

    # Both handlers are coroutines on purpose: kopf runs a plain function in a
    # thread, where ``on_node`` would change the node cache while a pass on the
    # loop iterates it, and ``enqueue`` would touch an asyncio queue off its loop.
    @kopf.on.event(GROUP, VERSION, "sandboxnodes", registry=registry)
    async def node_event(body: kopf.Body, **kwargs: Any) -> None:
        nodehealth.on_node(kwargs.get("type"), body)

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
            await taintlabels.sync(nodehealth.objects, body)

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
    taintlabels.register(registry, nodehealth.objects, leading)
    return registry


async def _cancel_on(stop: asyncio.Event, *tasks: asyncio.Task[None]) -> None:
    """Cancel ``tasks`` as soon as ``stop`` is set, beside kopf's own stop: kopf waits
    up to 5 s for every task it did not start (the workers' sub-tasks) to end."""
    await stop.wait()
    for task in tasks:
        task.cancel()


async def run(
    settings: OperatorSettings,
    *,
    kubeconfig: str | None = None,
    registry: CollectorRegistry = REGISTRY,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    metrics = OperatorMetrics(registry)
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    agent = f"sandlot-operator/{sandlot.__version__} ({identity})"
    elector: LeaderElector | None = None

    def leading() -> bool:
        return elector is None or elector.leading()

    # Every write of this replica passes the fence: none is sent unless it leads now.
    fence = WriteFence(leading)
    api = load_api_client(
        kubeconfig, counter=_CountingMetrics(metrics), fence=fence, user_agent=agent
    )
    # A missing namespace would leave the elector retrying forever, leader never.
    await asyncio.to_thread(require_namespace, api, settings.namespace)
    loop = asyncio.get_running_loop()
    nodehealth: NodeHealthController
    workloads: Workloads
    started = ready_flag or asyncio.Event()
    ticker = LoopTicker()
    # Served from here on, before the controllers exist: /readyz says so until then.
    readiness: list[Callable[[], Probe]] = []
    metrics_server = (
        serve_health(
            settings.metrics_port,
            registry,
            live=ticker.probe,
            ready=lambda: readiness[0]() if readiness else Probe(False, "starting"),
        )
        if settings.metrics_port
        else None
    )

    def on_leadership(leader: bool) -> None:
        metrics.is_leader.set(1 if leader else 0)
        log.info("%s is %s", identity, "the leader" if leader else "a standby")
        if leader:
            loop.call_soon_threadsafe(nodehealth.enqueue_all)
            loop.call_soon_threadsafe(workloads.on_leadership, True)
        loop.call_soon_threadsafe(broker.on_leadership, leader)

    # The elector's own client: unfenced (it must write the Lease to lead at all),
    # and every call bounded well below the renew deadline.
    renew_deadline = settings.leader_renew_deadline.total_seconds()
    election_api = load_api_client(
        kubeconfig,
        pool_size=2,
        request_timeout=(min(2.0, renew_deadline / 4), renew_deadline / 2),
        user_agent=agent,
    )
    elector = (
        LeaderElector(
            election_api,
            namespace=settings.namespace,
            name=settings.leader_lease_name,
            identity=identity,
            lease_duration=settings.leader_lease_duration.total_seconds(),
            renew_deadline=settings.leader_renew_deadline.total_seconds(),
            retry_period=settings.leader_retry_period.total_seconds(),
            on_change=on_leadership,
        )
        if settings.leader_election
        else None
    )
    objects = Objects(api)
    nodehealth = NodeHealthController(
        settings,
        objects,
        metrics,
        is_leader=leading,
        post_event=event_poster(objects),
    )
    nodehealth.bind_loop(loop)
    workloads = Workloads.build(
        settings,
        objects,
        WorkloadMetrics(registry),
        is_leader=leading,
        post_event=event_poster(objects),
        liveness=nodehealth.liveness,
    )
    workloads.scheduler.bind_loop(loop)
    readiness.append(lambda: nodehealth.liveness.readiness(started.is_set(), workloads.unsynced()))
    informer = LeaseInformer(
        api,
        settings.namespace,
        nodehealth.on_lease,
        on_view_restored=nodehealth.on_view_restored,
        on_view_lost=nodehealth.on_view_lost,
        on_heard=nodehealth.on_heard,
        watch_timeout=max(1, int(settings.lease_view_max_age.total_seconds() / 2)),
    )
    informer.start()
    # Every Sandbox through one lean watch of its own, not kopf's per-object
    # machinery (adapters.informer): the cache, and the pull-secret broker.
    broker = pullcredentials.PullCredentialBroker(
        objects,
        leading,
        settings.namespace,
        retry_interval=settings.env_reference_retry_interval.total_seconds(),
    )
    feed = SandboxFeed(workloads.cache, loop, [broker.on_sandbox])
    sandbox_informer = SandboxInformer(api, feed.on_event, feed.on_listed)
    sandbox_informer.start()
    if elector is not None:
        elector.start()
    else:
        metrics.is_leader.set(1)
    worker = asyncio.create_task(nodehealth.run(), name="node-health")
    workers = asyncio.create_task(workloads.run(), name="workloads")
    ticking = asyncio.create_task(ticker.run(), name="liveness-ticker")
    stop = stop_flag or asyncio.Event()

    stopper = asyncio.create_task(_cancel_on(stop, worker, workers, ticking), name="stop-workers")
    # Let the workers start their queues' tasks before kopf notes which tasks exist:
    # at its stop kopf waits 5 s for any task started after it (a SIGTERM that kopf's
    # own handler takes, before ours are back, would wait that long for them).
    for _ in range(STARTUP_YIELDS):
        await asyncio.sleep(0)
    kopf_registry = build_registry(connection_params(api), settings, nodehealth, elector, workloads)
    try:
        await kopf.operator(
            registry=kopf_registry,
            memories=WatchOnlyMemories(watch_only_kinds(kopf_registry)),
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            ready_flag=started,
        )
    finally:
        ticking.cancel()
        worker.cancel()
        workers.cancel()
        stopper.cancel()
        await asyncio.gather(worker, workers, stopper, return_exceptions=True)
        # Passes may still write from their threads: refuse every new write, wait for
        # those already sent, and only then let a standby take over. Writes that do not
        # end in time keep the Lease held; it expires by itself.
        drained = await asyncio.to_thread(fence.close, SHUTDOWN_DRAIN_SECONDS)
        if not drained:
            log.warning("writes still in flight at shutdown; the leader Lease is left to expire")
        if elector is not None:
            await asyncio.to_thread(elector.stop, drained)
        feed.close()
        broker.close()
        await asyncio.gather(
            asyncio.to_thread(informer.stop), asyncio.to_thread(sandbox_informer.stop)
        )
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        api.close()
        election_api.close()


def run_blocking(
    settings: OperatorSettings,
    kubeconfig: str | None = None,
    *,
    on_signal: Callable[[], None] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM; a clean stop releases the leader Lease.

    ``on_signal`` is called on the first signal (the CLI arms its exit watchdog).
    The loop is closed without waiting for threads still blocked in a request:
    ``asyncio.run`` would join the default executor without a bound.
    """
    import signal

    assert threading.current_thread() is threading.main_thread()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()

    def stopping() -> None:
        if on_signal is not None and not stop.is_set():
            on_signal()
        stop.set()

    def take_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping)

    async def main() -> None:
        ready = asyncio.Event()

        async def take_signals_back() -> None:
            # kopf installs its own handlers while it starts (they stop kopf alone);
            # once it is up, ours stop everything at once and arm the watchdog.
            await ready.wait()
            take_signals()

        retake = asyncio.create_task(take_signals_back(), name="signals")
        try:
            await run(settings, kubeconfig=kubeconfig, stop_flag=stop, ready_flag=ready)
        finally:
            retake.cancel()

    take_signals()
    try:
        loop.run_until_complete(main())
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=SHUTDOWN_DRAIN_SECONDS))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()  # its executor is shut down without waiting for blocked threads
