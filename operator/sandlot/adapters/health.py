"""The programs' HTTP endpoint: ``/metrics`` (Prometheus), ``/livez`` and
``/readyz`` (the kubelet's probes; 200 or 503 with the reason), ``/healthz`` (the
same as ``/livez``, its older name)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sandlot.adapters.startup import cannot_listen, setting_name
from sandlot.policy.probes import Probe

Check = Callable[[], Probe]


def serve_health(
    port: int,
    registry: CollectorRegistry,
    *,
    live: Check,
    ready: Check,
    field: str = "metrics_port",
) -> ThreadingHTTPServer:
    """Serve on ``port`` (all addresses) from a daemon thread; ``shutdown()`` ends it."""
    checks = {"/livez": live, "/healthz": live, "/readyz": ready}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in checks:
                try:
                    probe = checks[path]()
                except Exception as exc:  # a check that fails is a failed probe
                    probe = Probe(False, f"check failed: {exc}")
                self._send(200 if probe.ok else 503, "text/plain", probe.reason.encode() + b"\n")
            elif path in ("/metrics", "/"):
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # probes every few seconds would flood the log

    try:
        server = ThreadingHTTPServer(("", port), Handler)
    except OSError as e:
        raise cannot_listen(setting_name(field), port, e) from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
