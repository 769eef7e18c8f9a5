"""The operator program: kopf, embedded (``kopf.operator``), plus leader election
and the agents' Lease watch.

kopf's peering is switched off (``standalone``): every replica runs its handlers
and keeps its caches warm, and only the replica holding the leader Lease acts.
kopf keeps its bookkeeping in annotations, never in sandlot's status.

``build_parts`` builds everything first; ``controllers.startup.run_parts`` starts
the parts in order (clients, health, events, informers, leadership, kopf, workers)
and stops them in reverse (docs/architecture.md, "Start-up and stop").
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import sandlot
from sandlot.adapters.health import serve_health
from sandlot.adapters.informer import LeaseInformer, ObjectInformer, SandboxInformer
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
from sandlot.api.common import CLAIMS
from sandlot.controllers import pullcredentials
from sandlot.controllers.eventfeed import EventFeed
from sandlot.controllers.kopfwiring import build_registry
from sandlot.controllers.metrics import OperatorMetrics, WorkloadMetrics
from sandlot.controllers.nodehealth import NodeHealthController
from sandlot.controllers.probes import LoopTicker
from sandlot.controllers.settings import OperatorSettings
from sandlot.controllers.startup import (
    SHUTDOWN_DRAIN_SECONDS,
    KopfPart,
    Part,
    TaskPart,
    in_thread,
    leadership_part,
    run_parts,
    serve_until,
)
from sandlot.controllers.statedeletes import StateDeletes, state_deletes
from sandlot.controllers.workloads import Workloads

log = logging.getLogger(__name__)


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


class EventPoster:
    """Posts Events off the event loop, best effort: a pass never fails on an Event.

    One for the whole operator; ``close`` (at stop) drops what is still queued.
    """

    def __init__(self, objects: Objects) -> None:
        self.objects = objects
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="events")

    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        def send() -> None:
            try:
                post_event(
                    self.objects,
                    body,
                    type_=type_,
                    reason=reason,
                    message=message,
                    component="sandlot-operator",
                )
            except Exception as e:
                log.debug("event %s not posted: %s", reason, e)

        try:
            self.pool.submit(send)
        except RuntimeError:  # closed: the operator is stopping
            log.debug("event %s not posted: stopping", reason)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Leadership:
    """Whether this replica may act: the elector's answer once it is wired (always,
    without leader election; never before the elector exists)."""

    def __init__(self, election: bool) -> None:
        self.election = election
        self.elector: LeaderElector | None = None

    def leading(self) -> bool:
        if not self.election:
            return True
        return self.elector is not None and self.elector.leading()


@dataclass
class OperatorParts:
    """Everything the operator runs, built before anything starts."""

    settings: OperatorSettings
    registry: CollectorRegistry
    metrics: OperatorMetrics
    api: Any  # the fenced client (adapters.kube.load_api_client)
    election_api: Any  # the elector's own, unfenced
    fence: WriteFence
    leadership: Leadership
    events: EventPoster
    ticker: LoopTicker
    nodehealth: NodeHealthController
    workloads: Workloads
    broker: pullcredentials.PullCredentialBroker
    deletes: StateDeletes | None
    feed: EventFeed
    claim_feed: EventFeed
    lease_informer: LeaseInformer
    sandbox_informer: SandboxInformer
    claim_informer: ObjectInformer
    kopf: KopfPart
    elector: LeaderElector | None
    health: ThreadingHTTPServer | None = None
    ticking: asyncio.Task[None] | None = None

    def in_order(self) -> list[Part]:
        """The start order; the stop order is its reverse."""
        return [
            Part("clients", self._check_namespace, self._close_clients),
            Part("health", self._serve_health, self._stop_health),
            Part("events", stop=in_thread(self.events.close)),
            Part("informers", self._start_informers, self._stop_informers),
            leadership_part(
                self.fence,
                self.elector,
                on_no_election=lambda: self.metrics.is_leader.set(1),
            ),
            self.kopf.part(),
            TaskPart("workers", self.nodehealth.run, self.workloads.run).part(),
        ]

    async def _check_namespace(self) -> None:
        # A missing namespace would leave the elector retrying forever, leader never.
        await asyncio.to_thread(require_namespace, self.api, self.settings.namespace)

    async def _close_clients(self) -> None:
        self.api.close()
        self.election_api.close()

    async def _serve_health(self) -> None:
        # The loop's liveness from here on: a start-up that blocks it is seen too.
        self.ticking = asyncio.create_task(self.ticker.run(), name="liveness-ticker")
        if not self.settings.metrics_port:
            return
        self.health = serve_health(
            self.settings.metrics_port,
            self.registry,
            live=self.ticker.probe,
            ready=lambda: self.nodehealth.liveness.readiness(
                self.kopf.ready.is_set(), self.workloads.unsynced()
            ),
        )

    async def _stop_health(self) -> None:
        if self.health is not None:
            self.health.shutdown()
            self.health.server_close()
        if self.ticking is not None:
            self.ticking.cancel()
            await asyncio.gather(self.ticking, return_exceptions=True)

    async def _start_informers(self) -> None:
        self.lease_informer.start()
        self.sandbox_informer.start()
        if self.deletes is not None:
            self.deletes.start(self.leadership.leading)
        self.claim_informer.start()

    async def _stop_informers(self) -> None:
        self.feed.close()
        self.claim_feed.close()
        self.broker.close()
        if self.deletes is not None:
            self.deletes.close()
        await asyncio.gather(
            asyncio.to_thread(self.lease_informer.stop),
            asyncio.to_thread(self.sandbox_informer.stop),
            asyncio.to_thread(self.claim_informer.stop),
        )


def _brokers(
    settings: OperatorSettings, objects: Objects, leading: Callable[[], bool]
) -> tuple[pullcredentials.PullCredentialBroker, StateDeletes | None]:
    """What follows every Sandbox and SandboxSnapshot for the nodes: the broker of
    credentials and state keys, and (with a state repository) the state deletes."""
    broker = pullcredentials.PullCredentialBroker(
        objects,
        leading,
        settings.namespace,
        retry_interval=settings.env_reference_retry_interval.total_seconds(),
        state_keys=bool(settings.state_repository),
    )
    return broker, state_deletes(settings, objects)


def build_parts(
    settings: OperatorSettings,
    *,
    kubeconfig: str | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> OperatorParts:
    """Every part of the operator, wired; nothing runs until ``run_parts`` starts them.

    The elector is wired last: its callback reaches controllers that exist by then.
    """
    loop = asyncio.get_running_loop()
    metrics = OperatorMetrics(registry)
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    leadership = Leadership(settings.leader_election)
    # Every write of this replica passes the fence: none is sent unless it leads now.
    fence = WriteFence(leadership.leading)
    api, election_api = _clients(settings, kubeconfig, identity, metrics, fence)
    objects = Objects(api)
    events = EventPoster(objects)
    nodehealth = NodeHealthController(
        settings, objects, metrics, is_leader=leadership.leading, post_event=events
    )
    nodehealth.bind_loop(loop)
    workloads = Workloads.build(
        settings,
        objects,
        WorkloadMetrics(registry),
        is_leader=leadership.leading,
        post_event=events,
        liveness=nodehealth.liveness,
    )
    workloads.scheduler.bind_loop(loop)
    lease_informer = _lease_informer(api, settings, nodehealth)
    broker, deletes = _brokers(settings, objects, leadership.leading)
    feed, sandbox_informer, claim_feed, claim_informer = _object_informers(
        api, loop, workloads, broker, deletes
    )
    kopf_registry = build_registry(
        connection_params(api),
        settings,
        nodehealth,
        leadership.leading,
        workloads,
        snapshot_listeners=[
            broker.on_snapshot,
            *([deletes.on_snapshot] if deletes is not None else []),
        ],
    )
    kopf_part = KopfPart(kopf_registry, WatchOnlyMemories(watch_only_kinds(kopf_registry)))

    elector = _elector(settings, election_api, identity, metrics, nodehealth, workloads, broker)
    leadership.elector = elector
    return OperatorParts(
        settings=settings,
        registry=registry,
        metrics=metrics,
        api=api,
        election_api=election_api,
        fence=fence,
        leadership=leadership,
        events=events,
        ticker=LoopTicker(),
        nodehealth=nodehealth,
        workloads=workloads,
        broker=broker,
        deletes=deletes,
        feed=feed,
        lease_informer=lease_informer,
        sandbox_informer=sandbox_informer,
        claim_feed=claim_feed,
        claim_informer=claim_informer,
        kopf=kopf_part,
        elector=elector,
    )


def _lease_informer(
    api: Any, settings: OperatorSettings, nodehealth: NodeHealthController
) -> LeaseInformer:
    """The agents' Leases, for node health: its view's age bounds every verdict."""
    return LeaseInformer(
        api,
        settings.namespace,
        nodehealth.on_lease,
        on_view_restored=nodehealth.on_view_restored,
        on_view_lost=nodehealth.on_view_lost,
        on_heard=nodehealth.on_heard,
        watch_timeout=max(1, int(settings.lease_view_max_age.total_seconds() / 2)),
    )


def _object_informers(
    api: Any,
    loop: asyncio.AbstractEventLoop,
    workloads: Workloads,
    broker: pullcredentials.PullCredentialBroker,
    deletes: StateDeletes | None,
) -> tuple[EventFeed, SandboxInformer, EventFeed, ObjectInformer]:
    """Every Sandbox and every SandboxClaim through a lean watch of its own, not
    kopf's per-object machinery (adapters.informer): sandboxes feed the cache, the
    pull-secret broker and the state deletes; claims, whose bursts are the
    operator's busiest moments, the claim controller."""
    on_sandbox = [broker.on_sandbox, *([deletes.on_sandbox] if deletes is not None else [])]
    feed = EventFeed(workloads.cache, loop, on_sandbox)
    sandbox_informer = SandboxInformer(api, feed.on_event, feed.on_listed)
    claim_feed = EventFeed(workloads.claims, loop, name="claim")
    claim_informer = ObjectInformer(api, CLAIMS, claim_feed.on_event, claim_feed.on_listed)
    return feed, sandbox_informer, claim_feed, claim_informer


def _clients(
    settings: OperatorSettings,
    kubeconfig: str | None,
    identity: str,
    metrics: OperatorMetrics,
    fence: WriteFence,
) -> tuple[Any, Any]:
    """The fenced client every controller writes through, and the elector's own."""
    agent = f"sandlot-operator/{sandlot.__version__} ({identity})"
    api = load_api_client(
        kubeconfig, counter=_CountingMetrics(metrics), fence=fence, user_agent=agent
    )
    # The elector's own client: unfenced (it must write the Lease to lead at all),
    # and every call bounded well below the renew deadline.
    renew_deadline = settings.leader_renew_deadline.total_seconds()
    election_api = load_api_client(
        kubeconfig,
        pool_size=2,
        request_timeout=(min(2.0, renew_deadline / 4), renew_deadline / 2),
        user_agent=agent,
    )
    return api, election_api


def _elector(
    settings: OperatorSettings,
    election_api: Any,
    identity: str,
    metrics: OperatorMetrics,
    nodehealth: NodeHealthController,
    workloads: Workloads,
    broker: pullcredentials.PullCredentialBroker,
) -> LeaderElector | None:
    """The elector, wired last: what it tells of leadership reaches built controllers."""
    if not settings.leader_election:
        return None
    loop = asyncio.get_running_loop()

    def on_leadership(leader: bool) -> None:  # the elector's thread
        metrics.is_leader.set(1 if leader else 0)
        log.info("%s is %s", identity, "the leader" if leader else "a standby")
        if leader:
            loop.call_soon_threadsafe(nodehealth.enqueue_all)
            loop.call_soon_threadsafe(workloads.on_leadership, True)
        loop.call_soon_threadsafe(broker.on_leadership, leader)

    return LeaderElector(
        election_api,
        namespace=settings.namespace,
        name=settings.leader_lease_name,
        identity=identity,
        lease_duration=settings.leader_lease_duration.total_seconds(),
        renew_deadline=settings.leader_renew_deadline.total_seconds(),
        retry_period=settings.leader_retry_period.total_seconds(),
        on_change=on_leadership,
    )


async def run(
    settings: OperatorSettings,
    *,
    kubeconfig: str | None = None,
    registry: CollectorRegistry = REGISTRY,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or kopf ends by itself).

    ``ready_flag`` is set once every part has started.
    """
    parts = build_parts(settings, kubeconfig=kubeconfig, registry=registry)
    stop = stop_flag or asyncio.Event()

    async def serve() -> None:
        if ready_flag is not None:
            ready_flag.set()
        await serve_until(stop, parts.kopf.task)

    await run_parts(parts.in_order(), serve)


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
            # kopf installs its own handlers while it starts (they stop kopf, and the
            # parts with it, but arm no watchdog); once every part is up, ours do both.
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
