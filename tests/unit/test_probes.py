"""The programs' probes: liveness and readiness fail for different reasons
(sandlot.policy.probes), and the endpoint answers 200/503 with the reason
(sandlot.adapters.health, a real HTTP server on loopback)."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, Counter

from sandlot.adapters.health import serve_health
from sandlot.devtools.controlplane import free_port
from sandlot.policy.liveness import LeaseViewState
from sandlot.policy.probes import Probe, agent_ready, operator_live, operator_ready

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
BOUND = timedelta(seconds=45)


@pytest.mark.parametrize(
    ("last_tick", "now", "ok", "says"),
    [
        (None, 100.0, True, "starting"),
        (99.0, 100.0, True, "running"),
        (70.0, 100.0, True, "running"),
        (69.0, 100.0, False, "blocked for 31s"),
    ],
    ids=["not-ticked-yet", "ticked-now", "at-the-limit", "past-the-limit"],
)
def test_operator_liveness_is_the_event_loop_moving(
    last_tick: float | None, now: float, ok: bool, says: str
) -> None:
    probe = operator_live(last_tick, now, stall_after=30.0)
    assert probe.ok is ok
    assert says in probe.reason


@pytest.mark.parametrize(
    ("started", "since", "heard", "ok", "says"),
    [
        (False, NOW, NOW, False, "not started"),
        (True, None, None, False, "not listed"),
        (True, NOW - timedelta(minutes=5), NOW - timedelta(seconds=10), True, "ready"),
        (True, NOW - timedelta(seconds=5), None, True, "ready"),
        (True, NOW - timedelta(minutes=5), NOW - timedelta(seconds=46), False, "not heard from for 46s"),
        (True, NOW - timedelta(seconds=50), None, False, "not heard from for 50s"),
    ],
    ids=["kopf-not-started", "view-never-listed", "heard-recently", "listed-just-now",
         "silent-too-long", "listed-long-ago-never-heard"],
)  # fmt: skip
def test_operator_readiness_is_started_and_hearing_the_api_server(
    started: bool, since: datetime | None, heard: datetime | None, ok: bool, says: str
) -> None:
    probe = operator_ready(started, LeaseViewState(since=since, last_heard=heard), NOW, BOUND)
    assert probe.ok is ok
    assert says in probe.reason


def test_operator_readiness_waits_for_every_cache_to_be_synced() -> None:
    view = LeaseViewState(since=NOW - timedelta(seconds=5), last_heard=NOW)
    probe = operator_ready(True, view, NOW, BOUND, ["sandboxes"])
    assert not probe.ok
    assert probe.reason == "caches not synced yet: sandboxes"
    assert operator_ready(True, view, NOW, BOUND, []).ok


@pytest.mark.parametrize(
    ("started", "error", "ok", "says"),
    [
        (False, None, False, "sweep not done"),
        (False, "connection refused", False, "sweep not done"),
        (True, "connection refused", False, "containerd unreachable: connection refused"),
        (True, None, True, "ready"),
    ],
    ids=["starting", "starting-and-containerd-down", "containerd-down", "ready"],
)
def test_agent_readiness_is_swept_and_containerd_answering(
    started: bool, error: str | None, ok: bool, says: str
) -> None:
    probe = agent_ready(started, error)
    assert probe.ok is ok
    assert says in probe.reason


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_endpoint_answers_each_probe_and_the_metrics() -> None:
    registry = CollectorRegistry()
    Counter("sandlot_probe_test", "a metric", registry=registry).inc()
    state = {"ready": Probe(False, "start-up sweep not done yet")}

    def broken() -> Probe:
        raise RuntimeError("boom")

    port = free_port()
    server = serve_health(
        port, registry, live=lambda: Probe(True, "serving"), ready=lambda: state["ready"]
    )
    try:
        assert _get(port, "/livez") == (200, "serving\n")
        assert _get(port, "/healthz") == (200, "serving\n")
        assert _get(port, "/readyz") == (503, "start-up sweep not done yet\n")
        state["ready"] = Probe(True, "ready")
        assert _get(port, "/readyz") == (200, "ready\n")
        status, body = _get(port, "/metrics")
        assert status == 200 and "sandlot_probe_test_total 1.0" in body
        assert _get(port, "/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
    port = free_port()
    server = serve_health(port, registry, live=broken, ready=broken)
    try:
        assert _get(port, "/livez") == (503, "check failed: boom\n")
    finally:
        server.shutdown()
        server.server_close()
