"""The hole the leader fence closes, on the real API server: a leader whose own
fence judged a write allowed, then paused before sending it (a seam at the fence's
own check, where a SIGSTOP would land), wakes after its successor took over and
wrote; the server refuses the late write although the Sandbox did not change.
And two ``sandlot operator`` processes, run as the chart runs them, hand over
through the fence."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.adapters.kube import RequestCounter, WriteFence
from sandlot.adapters.leader import LeaderElector
from sandlot.adapters.objects import Leases, Objects
from sandlot.adapters.statuswrite import WriteOutcome, WriteResult, write_status
from sandlot.api.common import GROUP, VERSION
from sandlot.policy.marking import dead_status
from tests.support.chart import operator_replica
from tests.support.leaderfence import NODE, Release, make_sandbox, release, tag
from tests.support.operator import Fleet, OperatorProcess, wipe_nodes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration
__all__ = ["release", "tag"]  # fixtures


class PauseAfterCheck:
    """The client fence's check, then a pause before the send, as a SIGSTOP landing
    between the two would: once armed, the next check that passes holds its thread
    (with its verdict already given) until released."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self.check = check
        self.armed = threading.Event()
        self.paused = threading.Event()
        self.released = threading.Event()

    def __call__(self) -> bool:
        verdict = self.check()
        if verdict and self.armed.is_set():
            self.armed.clear()
            self.paused.set()
            if not self.released.wait(60):
                raise AssertionError("the paused write was never released")
        return verdict


def _elector(release: Release, api: client.ApiClient, identity: str) -> LeaderElector:
    return LeaderElector(
        api,
        namespace=release.ids.namespace,
        name=release.lease,
        identity=identity,
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )


def test_a_leader_paused_between_its_fence_and_its_send_is_refused_by_the_server(
    release: Release, tag: str
) -> None:
    old_id, new_id = f"op-old-{tag}", f"op-new-{tag}"
    release.hold(None)
    old_election, new_election = release.replica(old_id), release.replica(new_id)
    old = _elector(release, old_election, old_id)
    new = _elector(release, new_election, new_id)
    pause = PauseAfterCheck(old.leading)
    old_counter, new_counter = RequestCounter(), RequestCounter()
    old_api = release.replica(old_id, fence=WriteFence(pause), counter=old_counter)
    new_api = release.replica(new_id, fence=WriteFence(new.leading), counter=new_counter)
    live, first, other = (f"{n}-{tag}" for n in ("live", "first", "other"))
    for name in (live, first, other):
        make_sandbox(release.kube, release.tenant, name)
    marks: list[WriteResult] = []

    def mark(api: client.ApiClient, name: str) -> WriteResult:
        obj = Objects(api).get_sandbox(release.tenant, name)
        return write_status(
            Objects(api), obj, dead_status("NodeLost", "lost", datetime.now(UTC)), node=NODE
        )

    try:
        old.start()
        wait_for(old.leading, timeout=15, what="the first replica to lead")
        assert mark(old_api, first).outcome == WriteOutcome.WRITTEN
        assert sum(old_counter.calls.values()) >= 1
        # Its next mark passes the client fence, then the replica freezes before sending.
        before = dict(Objects(release.kube).get_sandbox(release.tenant, live))
        pause.armed.set()
        marking = threading.Thread(target=lambda: marks.append(mark(old_api, live)))
        marking.start()
        assert pause.paused.wait(15), "the old leader's mark never reached its fence"
        old.stop(release=False)  # a frozen process renews nothing
        new.start()
        wait_for(new.leading, timeout=20, what="the standby to take over")
        lease = Leases(release.kube, release.ids.namespace).get(release.lease)
        assert lease is not None and lease.holder == new_id, lease
        assert mark(new_api, other).outcome == WriteOutcome.WRITTEN
        # The Sandbox the old leader is about to mark never changed: its
        # resourceVersion precondition still holds, only the server's fence can refuse.
        still = Objects(release.kube).get_sandbox(release.tenant, live)
        assert still["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        sent_before = old_counter.snapshot()
        pause.released.set()
        marking.join(30)
        assert not marking.is_alive(), "the old leader's mark never came back"
    finally:
        pause.released.set()
        old.stop(release=False)
        new.stop()
    (result,) = marks
    after = Objects(release.kube).get_sandbox(release.tenant, live)
    assert after["status"]["phase"] == "Running", (
        f"the old leader's late mark landed: {after['status']} ({result})"
    )
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert result.outcome == WriteOutcome.FAILED and "leader fence refused" in result.detail, result
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{release.tenant}/sandboxes/{live}/status"

    def to_live(calls: Counter[tuple[str, str]]) -> int:
        return sum(n for (verb, url), n in calls.items() if verb == "PATCH" and url.endswith(path))

    # It was sent (the client fence had let it through), refused once, never resent.
    assert to_live(old_counter.calls) == to_live(sent_before) + 1 == 1
    assert to_live(old_counter.fenced) == 1
    for api in (old_api, new_api, old_election, new_election):
        api.close()


FAST_ELECTION = (
    "--grace-period",
    "2s",
    "--resync-interval",
    "1s",
    "--leader-lease-duration",
    "3s",
    "--leader-renew-deadline",
    "2s",
    "--leader-retry-period",
    "0.5s",
)


def test_a_standby_that_takes_over_from_a_killed_leader_marks_through_the_fence(
    release: Release, tmp_path: Path
) -> None:
    """Two ``sandlot operator`` processes as the chart runs them (pod-bound tokens,
    identities their pods' names): the leader is killed, the standby takes the Lease
    and its markings are admitted, its first writes resent if the API server's copy
    of the Lease still named the dead leader."""
    wipe_nodes(release.kube)
    release.hold(None)
    fleet = Fleet(release.kube, release.tenant, release.ids.namespace)
    ops: list[OperatorProcess] = []

    def operator() -> OperatorProcess:
        config, identity = operator_replica(
            release.kube, release.plane, release.installed, tmp_path
        )
        op = OperatorProcess(
            release.plane,
            tmp_path,
            release.ids.namespace,
            *FAST_ELECTION,
            "--leader-lease-name",
            release.lease,
            kubeconfig=config,
            identity=identity,
        )
        ops.append(op)
        op.wait_metrics()
        return op

    try:
        node = fleet.node("n1")
        lease = fleet.lease(node)
        fleet.sandbox("first", node, "Running")
        leader = operator()
        wait_for(leader.is_leader, timeout=30, what="the first operator to lead")
        standby = operator()
        wait_for(
            lambda: fleet.get_node(node).get("status", {}).get("phase") == "Ready",
            timeout=30,
            what="the node Ready under the first leader",
        )
        leader.kill()  # no release: the standby waits out the Lease
        wait_for(standby.is_leader, timeout=30, what="the standby to take over")
        held = Leases(release.kube, release.ids.namespace).get(release.lease)
        assert held is not None and held.holder == standby.identity, held
        lease.pause()
        wait_for(
            lambda: fleet.phase("first") == "Dead",
            timeout=40,
            what="the new leader to mark the lost node's sandbox Dead",
        )
        assert fleet.get("first")["status"]["reason"] == "NodeLost"
        assert (
            "ServerFenced" not in standby.log()
            and "leader fence: the API server refused" not in (standby.log())
        ), standby.log()
    finally:
        for op in ops:
            op.stop()
        fleet.cleanup()
