"""The agent's probes on its metrics port (``sandlot.adapters.health``): live while
the process answers; ready once the start-up sweep is done and while containerd
answers a version call (``sandlot.policy.probes.agent_ready``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry

from sandlot.adapters.health import serve_health
from sandlot.adapters.runtime import Runtime, RuntimeError_
from sandlot.policy.probes import Probe, agent_ready

# Below the chart's readinessProbe timeoutSeconds (3 s).
PROBE_CALL_TIMEOUT = 2.0


def serve_agent_health(
    port: int,
    registry: CollectorRegistry,
    started: threading.Event,
    runtime: Callable[[], Runtime | None],
) -> ThreadingHTTPServer:
    def ready() -> Probe:
        error = None
        rt = runtime()
        if started.is_set() and rt is not None:
            try:
                rt.version(timeout=PROBE_CALL_TIMEOUT)
            except RuntimeError_ as exc:
                error = str(exc)
        return agent_ready(started.is_set(), error)

    return serve_health(port, registry, live=lambda: Probe(True, "serving"), ready=ready)
