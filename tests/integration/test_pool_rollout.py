"""A pool's template change rolls its members on the real control plane with real
agents, ``sandlot pool status`` waits for it like ``kubectl rollout status``, and
a pool whose members keep failing backs off, saying so in its status and an Event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import parse_time
from tests.support.pools import Cluster, Start, phase, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


TERMINAL = ("Dead", "Stopped", "Failed")


def patch_template(c: Cluster, pool: str, spec: dict[str, Any]) -> None:
    c.objs.patch_namespaced_custom_object(
        GROUP, VERSION, c.namespace, "sandboxpools", pool, {"spec": {"template": {"spec": spec}}}
    )


def test_template_change_rolls_members_and_pool_status_waits_for_it(
    cluster: Cluster, operators: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("web", 4)
    before = {m["metadata"]["name"] for m in cluster.wait_running("web", 4)}
    assert (
        cluster.sandlot("pool", "status", "web", "-n", cluster.namespace, "--timeout", "60s") == 0
    )

    patch_template(cluster, "web", {"env": [{"name": "VERSION", "value": "2"}]})
    live_seen: list[int] = []

    def rolled() -> bool:
        members = cluster.members("web")
        live = [m for m in members if phase(m) not in TERMINAL]
        live_seen.append(len(live))
        current = [
            m for m in live if (m["spec"].get("env") or []) == [{"name": "VERSION", "value": "2"}]
        ]
        return len(current) == 4 and all(phase(m) == "Running" for m in live) and len(live) == 4

    code = cluster.sandlot("pool", "status", "web", "-n", cluster.namespace, "--timeout", "90s")
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'pool "web" successfully rolled out' in out.splitlines()[-1], out
    wait_for(rolled, timeout=10, what="the rolled members as the status said")
    after = {m["metadata"]["name"] for m in cluster.live("web")}
    assert not (after & before), "every member was replaced"
    status = cluster.pool("web")["status"]
    assert (status["updatedReplicas"], status["readyReplicas"]) == (4, 4)
    assert max(live_seen) <= 5


def test_pool_status_times_out_with_exit_1_when_the_rollout_cannot_finish(
    cluster: Cluster, operators: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("stuck", 2)
    cluster.wait_running("stuck", 2)
    patch_template(cluster, "stuck", {"image": "docker.io/sandlot/not-there:1"})
    code = cluster.sandlot("pool", "status", "stuck", "-n", cluster.namespace, "--timeout", "4s")
    out = capsys.readouterr().out
    assert code == 1, out
    assert "timed out after 4s" in out and "Waiting for pool" in out, out


def test_members_that_keep_failing_back_off_in_status_and_an_event(
    cluster: Cluster, operators: Start
) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("broken", 1)
    patch_template(
        cluster, "broken", {"image": "docker.io/sandlot/not-there:1", "imagePullPolicy": "Never"}
    )

    def backing_off() -> dict[str, Any] | None:
        status = cluster.pool("broken").get("status") or {}
        return status if status.get("failedInARow", 0) >= 1 and status.get("backoffUntil") else None

    status = wait_for(backing_off, timeout=40, what="pool broken to back off")
    failed = [m for m in cluster.members("broken") if phase(m) == "Failed"]
    live = cluster.live("broken")
    assert len(failed) == status["failedInARow"], (failed, status)
    assert len(live) <= 1
    events = client.CoreV1Api(cluster.kube).list_namespaced_event(
        cluster.namespace, field_selector="involvedObject.name=broken,reason=BackOff"
    )
    assert events.items and "failed in a row" in str(events.items[0].message)
    # The wait is the back-off's: 10 s after the newest failure, doubled per failure.
    ended = [parse_time(m["status"]["finishedAt"]) for m in failed]
    until = parse_time(status["backoffUntil"])
    assert until is not None and ended and None not in ended, (until, ended)
    newest = max(t for t in ended if t is not None)
    expected = min(10 * 2 ** (len(failed) - 1), 300)
    assert abs((until - newest).total_seconds() - expected) < 0.01, (until, newest)


def test_a_rollout_to_members_that_crash_after_starting_keeps_the_floor_running(
    cluster: Cluster, operators: Start
) -> None:
    """Members of the new template run 3 s, then exit 1: Running, briefly, but never
    available under minReadySeconds, so no old member is deleted for them beyond
    maxUnavailable, and the pool never has fewer than replicas - maxUnavailable
    Running members (sampled all through the rollout and its back-off)."""
    cluster.add_node("a", capacity=12)
    start_operator(cluster, operators)
    cluster.create_pool("web", 4)
    cluster.objs.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        "sandboxpools",
        "web",
        {
            "spec": {
                "minReadySeconds": 10,
                "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}},
            }
        },
    )
    stored = cluster.pool("web")["spec"]
    assert stored.get("minReadySeconds") == 10, "the API server dropped minReadySeconds"
    before = {m["metadata"]["name"] for m in cluster.wait_running("web", 4)}

    def available() -> bool:  # every old member Running for minReadySeconds: it counts
        since = [parse_time(m["status"].get("startedAt")) for m in cluster.running("web")]
        now = datetime.now(UTC)
        return len(since) == 4 and all(s and now - s > timedelta(seconds=11) for s in since)

    wait_for(available, timeout=30, interval=0.5, what="the old members to count as available")

    patch_template(cluster, "web", {"command": ["sh", "-c", "sleep 3; exit 1"]})
    lowest = 4
    samples = 0

    def crashed_and_backing_off() -> bool:
        nonlocal lowest, samples
        members = cluster.members("web")
        running = sum(1 for m in members if phase(m) == "Running")
        lowest = min(lowest, running)
        samples += 1
        new = [m for m in members if m["metadata"]["name"] not in before]
        crashed = [m for m in new if (m.get("status") or {}).get("exitCode") == 1]
        status = cluster.pool("web").get("status") or {}
        return len(crashed) >= 2 and bool(status.get("backoffUntil"))

    wait_for(
        crashed_and_backing_off,
        timeout=90,
        interval=0.1,
        what="two new members to crash and the pool to back off",
    )
    deadline_samples = samples + 50  # a few seconds more of the back-off
    while samples < deadline_samples:
        crashed_and_backing_off()
    assert lowest >= 3, f"Running members fell to {lowest} during the rollout (floor 3)"
    old_left = {m["metadata"]["name"] for m in cluster.running("web")} & before
    assert len(old_left) >= 3, f"only {sorted(old_left)} of the old members still run"
