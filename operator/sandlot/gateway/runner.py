"""The stream gateway as a process: its parts built from settings, then started in
their order (``GatewayParts.in_order``), served until a signal, and stopped in
reverse. ``build`` returns them unstarted, so tests and the dev tooling run the
same gateway in a thread of their own."""

from __future__ import annotations

import logging
import signal as signals
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry

from sandlot.adapters.agentpods import NoAgent, SandboxNotFound, agent_address, sandbox_placement
from sandlot.adapters.agentsandboxapi import claim_env_of
from sandlot.adapters.frontproxy import FrontProxy, NoFrontProxy, read_front_proxy
from sandlot.adapters.health import serve_health
from sandlot.adapters.mtls import ReloadingTls, client_context, read_files, serving_context
from sandlot.adapters.reviews import review_access
from sandlot.adapters.startorder import StartedParts, ThreadPart
from sandlot.adapters.startup import StartupError, api_error_line, setting_name
from sandlot.gateway.metrics import GatewayMetrics
from sandlot.gateway.placements import CachedPlacements
from sandlot.gateway.reviews import CachedReviews
from sandlot.gateway.router import RouterServer
from sandlot.gateway.server import Backends, Gateway, Refusal, Sessions
from sandlot.gateway.settings import GatewaySettings
from sandlot.policy.probes import Probe
from sandlot.policy.router import RouterError
from sandlot.policy.streamaccess import (
    RequestHeaderConfig,
)

log = logging.getLogger(__name__)


class FrontProxyView:
    """The front proxy's CA and header names, and the serving context trusting that
    CA, re-read every ``refresh`` seconds with the gateway's certificate files. A
    change builds a new context that new connections get: a CA added to the file or
    ConfigMap is trusted, one removed from it is not any more (a rotation keeps both
    in the bundle for its overlap, as the API server's own CA file does)."""

    def __init__(self, read: Callable[[], FrontProxy], cert: str, key: str, first: FrontProxy):
        self._read = read
        self._cert, self._key = cert, key
        self._config = first.config
        self._ca_pem = first.ca_pem
        self._files = self._read_files()
        self.tls = serving_context(cert, key, first.ca_pem)

    def config(self) -> RequestHeaderConfig:
        return self._config

    def _read_files(self) -> tuple[bytes, ...]:
        return read_files((self._cert, self._key))

    def refresh(self) -> ssl.SSLContext | None:
        """Re-read all of it; the new serving context when the CA or the certificate
        files changed (and load), else None. A failed read keeps what was."""
        try:
            current = self._read()
        except Exception as e:
            log.warning("cannot re-read the front proxy's configuration: %s", api_error_line(e))
            return None
        self._config = current.config
        files = self._read_files()
        if current.ca_pem == self._ca_pem and files == self._files:
            return None
        try:
            tls = serving_context(self._cert, self._key, current.ca_pem)
        except (OSError, ssl.SSLError, ValueError) as e:  # caught half-written
            log.warning("the gateway's TLS files or front-proxy CA changed but do not load: %s", e)
            return None
        if current.ca_pem != self._ca_pem:
            log.info("the front proxy's CA changed: new connections trust the new bundle only")
        self._ca_pem, self._files, self.tls = current.ca_pem, files, tls
        return tls


def cluster_backends(api: Any, settings: GatewaySettings) -> Backends:
    timeout = settings.call_timeout.total_seconds()

    def review(spec: Mapping[str, Any]) -> Mapping[str, Any]:
        return review_access(api, spec, timeout=timeout)

    def node_of(namespace: str, name: str) -> str:
        try:
            node, phase = sandbox_placement(api, namespace, name, timeout=timeout)
        except SandboxNotFound as e:
            raise Refusal(404, str(e)) from None
        except Exception as e:
            raise Refusal(
                503, f"cannot read sandbox {namespace}/{name}", api_error_line(e)
            ) from None
        if not node:
            raise Refusal(409, f'sandbox "{name}" is {phase or "Pending"} and not on any node yet')
        return node

    def agent_of(node: str) -> tuple[str, int]:
        try:
            return agent_address(
                api, settings.namespace, settings.agent_selector, node, timeout=timeout
            )
        except NoAgent as e:
            raise Refusal(503, str(e)) from None
        except Exception as e:
            raise Refusal(503, f"cannot find node {node}'s agent", api_error_line(e)) from None

    placements = CachedPlacements(node_of, agent_of)
    return Backends(
        review=review,
        node_of=placements.node_of,
        agent_of=placements.agent_of,
        forget=placements.forget,
    )


def claim_envs(api: Any, settings: GatewaySettings) -> Callable[[str, str], Mapping[str, str]]:
    """``claim_env_of``, remembered ``CLAIM_ENV_TTL`` seconds per sandbox: a claim's
    env is fixed at its creation, and a command should not cost two reads."""
    timeout = settings.call_timeout.total_seconds()
    known: dict[tuple[str, str], tuple[float, Mapping[str, str]]] = {}
    lock = threading.Lock()

    def env(namespace: str, sandbox: str) -> Mapping[str, str]:
        now = time.monotonic()
        with lock:
            hit = known.get((namespace, sandbox))
        if hit is not None and now - hit[0] < CLAIM_ENV_TTL:
            return hit[1]
        try:
            found = claim_env_of(api, namespace, sandbox, timeout)
        except Exception as e:
            raise RouterError(
                503, f"cannot read sandbox {namespace}/{sandbox}'s claim: {e}"
            ) from None
        with lock:
            if len(known) > 10_000:
                known.clear()
            known[(namespace, sandbox)] = (now, found)
        return found

    return env


CLAIM_ENV_TTL = 10.0


@dataclass
class GatewayParts:
    gateway: Gateway
    front_proxy: FrontProxyView
    registry: CollectorRegistry
    tls_files: tuple[ReloadingTls, ...] = ()
    router: RouterServer | None = None
    metrics_port: int = 0
    """Where ``/livez``, ``/readyz`` and ``/metrics`` are served; 0: not served."""
    _started: StartedParts = field(default_factory=StartedParts, init=False, repr=False)
    _health: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)

    def in_order(self) -> list[ThreadPart]:
        """The gateway's parts in their start-up order (stopped in reverse): the
        probes say it serves only once it does."""
        parts = [ThreadPart("gateway", self.gateway.start, self.gateway.shutdown)]
        if self.router is not None:
            parts.append(ThreadPart("router", self.router.start, self.router.shutdown))
        if self.metrics_port:
            parts.append(ThreadPart("health", self._serve_health, self._stop_health))
        return parts

    def start(self) -> None:
        self._started.start(self.in_order())

    def shutdown(self) -> None:
        self._started.close()

    def _serve_health(self) -> None:
        serving = Probe(True, "serving")
        self._health = serve_health(
            self.metrics_port, self.registry, live=lambda: serving, ready=lambda: serving
        )

    def _stop_health(self) -> None:
        if self._health is not None:
            self._health.shutdown()

    def refresh(self) -> None:
        """The front proxy's CA and names, and rotated certificate files."""
        serving = self.front_proxy.refresh()
        if serving is not None:
            self.gateway.serve_tls(serving)
            if self.router is not None:
                self.router.serve_tls(serving)
        for files in self.tls_files:
            files.refresh()


def build(
    settings: GatewaySettings,
    api: Any,
    *,
    registry: CollectorRegistry | None = None,
    backends: Backends | None = None,
) -> GatewayParts:
    """The gateway of ``settings``, not yet listening; a missing front proxy or an
    unreadable certificate is a ``StartupError`` naming the setting."""
    timeout = settings.call_timeout.total_seconds()

    def read() -> FrontProxy:
        if settings.requestheader_client_ca:
            with open(settings.requestheader_client_ca) as f:
                return FrontProxy(f.read(), RequestHeaderConfig())
        return read_front_proxy(api, timeout=timeout)

    try:
        first = read()
    except NoFrontProxy as e:
        raise StartupError(f"{setting_name('requestheader_client_ca')}: {e}") from None
    tls_names = ", ".join(setting_name(n) for n in ("tls_cert", "tls_key", "stream_ca"))
    try:
        view = FrontProxyView(read, settings.tls_cert, settings.tls_key, first)
        agent_tls = client_context(settings.stream_ca, settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise StartupError(f"{tls_names}: cannot load the gateway's TLS files: {e}") from None
    registry = registry or CollectorRegistry()
    metrics = GatewayMetrics(registry)
    sessions = Sessions(
        settings.max_sessions,
        settings.max_sessions_per_user,
        settings.max_sessions_per_namespace,
        settings.max_sessions_per_group,
    )
    metrics.open.set_function(lambda: sessions.open)
    backends = backends or cluster_backends(api, settings)
    backends = replace(
        backends,
        review=CachedReviews(
            backends.review,
            ttl=settings.review_cache_ttl.total_seconds(),
            max_entries=settings.review_cache_size,
            on_answer=lambda source: metrics.reviews.labels(source).inc(),
        ),
    )
    gateway = Gateway(
        bind=settings.bind,
        port=settings.port,
        server_tls=view.tls,
        agent_tls=agent_tls,
        requestheader=view.config,
        backends=backends,
        sessions=sessions,
        call_timeout=timeout,
        idle_timeout=settings.idle_timeout.total_seconds(),
        on_stream=lambda kind, outcome: metrics.streams.labels(kind, outcome).inc(),
    )
    files = (ReloadingTls(agent_tls, settings.tls_cert, settings.tls_key, [settings.stream_ca]),)
    router = (
        RouterServer(
            gateway,
            bind=settings.bind,
            port=settings.router_port,
            server_tls=view.tls,
            claim_env=claim_envs(api, settings),
            call_timeout=timeout,
        )
        if settings.router
        else None
    )
    return GatewayParts(gateway, view, registry, files, router, settings.metrics_port)


def run(settings: GatewaySettings, kubeconfig: str | None = None) -> int:
    """Serve until SIGTERM/SIGINT."""
    from sandlot.adapters.kube import load_api_client

    api = load_api_client(kubeconfig)
    stop = threading.Event()
    for sig in (signals.SIGTERM, signals.SIGINT):
        signals.signal(sig, lambda *_: stop.set())
    parts = build(settings, api)
    started = StartedParts()
    try:
        started.start(process_parts(api, parts))
        while not stop.wait(settings.requestheader_refresh.total_seconds()):
            parts.refresh()
    finally:
        started.close()
    return 0


def process_parts(api: Any, parts: GatewayParts) -> list[ThreadPart]:
    """The gateway process's start-up order: its API client (closed last), then its
    parts (``GatewayParts.in_order``)."""
    return [ThreadPart("clients", stop=api.close), *parts.in_order()]


__all__ = [
    "FrontProxyView",
    "GatewayParts",
    "build",
    "cluster_backends",
    "process_parts",
    "run",
]
