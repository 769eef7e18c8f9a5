"""Which sandbox events re-broker a node's pull secrets, and when: only the leader
brokers, and what a replica saw while standing by is brokered when it leads."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.controllers import pullcredentials
from sandlot.controllers.pullcredentials import PullCredentialBroker


def body(uid: str, node: str, *secrets: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "t", "name": uid},
        "spec": {"nodeName": node, "imagePullSecrets": [{"name": s} for s in secrets]},
        "status": {"phase": phase},
    }


class Leading:
    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


@pytest.fixture
def brokered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    nodes: list[str] = []

    def broker_node(objects: Any, namespace: str, node: str, **_: Any) -> bool:
        nodes.append(node)
        return True

    monkeypatch.setattr(pullcredentials, "broker_node", broker_node)
    return nodes


def settle(broker: PullCredentialBroker) -> None:
    """Wait (bounded by the executor's own join) for what was submitted to run."""
    broker._broker.shutdown(wait=True)


def drained(broker: PullCredentialBroker) -> None:
    """Wait for what was submitted so far to run, the broker still open: its one
    thread runs submissions in order, so a no-op submitted now runs after them."""
    broker._broker.submit(lambda: None).result(timeout=30)


def test_a_standby_brokers_nothing_then_brokers_what_it_saw_once_it_leads(
    brokered: list[str],
) -> None:
    leading = Leading(False)
    broker = PullCredentialBroker(object(), leading, "sandlot-system")  # type: ignore[arg-type]
    broker.on_sandbox("SYNC", body("a", "n1", "regcred"))
    broker.on_sandbox("SYNC", body("b", "n2", "regcred"))
    broker.on_sandbox("SYNC", body("c", "n1", "other"))
    assert broker.wanted.keys() == {"a", "b", "c"}, "the standby did not take in the feed"
    drained(broker)
    assert brokered == [], "a standby brokered pull secrets"

    leading.value = True
    broker.on_leadership(True)
    settle(broker)
    assert brokered == ["n1", "n2"], "a new leader did not broker each node it saw once"


def test_the_leader_brokers_on_a_change_of_what_a_sandbox_brings_not_on_its_status(
    brokered: list[str],
) -> None:
    broker = PullCredentialBroker(object(), Leading(True), "sandlot-system")  # type: ignore[arg-type]
    broker.on_sandbox("ADDED", body("a", "n1", "regcred", phase="Scheduled"))
    broker.on_sandbox("MODIFIED", body("a", "n1", "regcred", phase="Running"))  # same signature
    broker.on_sandbox("MODIFIED", body("a", "n1", "regcred", phase="Stopped"))  # now terminal
    broker.on_sandbox("MODIFIED", body("x", "n3"))  # no pull secrets: not this broker's
    broker.on_sandbox("DELETED", body("a", "n1", "regcred", phase="Stopped"))
    settle(broker)
    assert brokered == ["n1", "n1", "n1"]
    assert broker.wanted == {}, "a deleted sandbox is still wanted"


def test_a_lost_leadership_forgets_what_was_brokered_so_the_next_one_brokers_again(
    brokered: list[str],
) -> None:
    leading = Leading(True)
    broker = PullCredentialBroker(object(), leading, "sandlot-system")  # type: ignore[arg-type]
    broker.on_sandbox("ADDED", body("a", "n1", "regcred"))
    leading.value = False
    broker.on_leadership(False)
    broker.on_sandbox("MODIFIED", body("a", "n1", "regcred"))
    leading.value = True
    broker.on_leadership(True)
    settle(broker)
    assert brokered == ["n1", "n1"]


def env_body(uid: str, node: str, phase: str, reason: str = "") -> dict[str, Any]:
    ref = {"secretKeyRef": {"name": "db", "key": "pw"}}
    return {
        "metadata": {"uid": uid, "namespace": "t", "name": uid},
        "spec": {"nodeName": node, "env": [{"name": "PW", "valueFrom": ref}]},
        "status": {"phase": phase, "reason": reason},
    }


def test_a_node_with_a_sandbox_waiting_for_a_reference_is_re_brokered_until_it_runs(
    brokered: list[str],
) -> None:
    leading = Leading(True)
    broker = PullCredentialBroker(object(), leading, "sandlot-system")  # type: ignore[arg-type]
    try:
        broker.on_sandbox("ADDED", env_body("a", "n1", "Scheduled"))
        broker.on_sandbox("ADDED", env_body("b", "n2", "Running"))
        assert broker.waiting == {}, "a sandbox not yet refused is waiting"
        assert broker.retry_waiting() == [], "a retry with nothing waiting"
        broker.on_sandbox(
            "MODIFIED", env_body("a", "n1", "Scheduled", "CreateContainerConfigError")
        )
        assert broker.waiting == {"a": "n1"}
        for _ in range(3):  # the retry timer's ticks
            assert broker.retry_waiting() == ["n1"]
        drained(broker)
        assert brokered.count("n1") == 1 + 3, "the waiting sandbox's node not re-brokered"
        assert brokered.count("n2") == 1, "a running sandbox's node retried"
        leading.value = False
        assert broker.retry_waiting() == [], "a standby retried"
        leading.value = True
        broker.on_sandbox("MODIFIED", env_body("a", "n1", "Running", "Started"))
        assert broker.waiting == {}, "a started sandbox still waits"
        assert broker.retry_waiting() == []
    finally:
        broker.close()


def test_with_state_keys_a_moved_sandbox_re_brokers_the_node_it_left_and_the_one_it_reached(
    brokered: list[str],
) -> None:
    """Its key leaves the old node at once, not at that node's next change."""
    broker = PullCredentialBroker(
        object(),  # type: ignore[arg-type]
        Leading(True),
        "sandlot-system",
        state_keys=True,
    )
    broker.on_sandbox("ADDED", body("a", "n1"))  # no pull secret: its state key alone
    broker.on_sandbox("MODIFIED", body("a", "n1", phase="Running"))  # nothing new
    broker.on_sandbox("MODIFIED", body("a", "n2", phase="Running"))  # moved
    settle(broker)
    assert brokered == ["n1", "n2", "n1"]


def shot(uid: str, node: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "t", "name": uid},
        "spec": {"sandboxName": "a", "nodeName": node},
        "status": {"phase": phase},
    }


def test_with_state_keys_a_snapshot_being_taken_brings_its_key_and_its_end_takes_it(
    brokered: list[str],
) -> None:
    leading = Leading(True)
    broker = PullCredentialBroker(
        object(),  # type: ignore[arg-type]
        leading,
        "sandlot-system",
        state_keys=True,
    )
    broker.on_snapshot("ADDED", shot("s", "n1", "Pending"))
    broker.on_snapshot("MODIFIED", shot("s", "n1", "Taking"))  # same node, not ended
    broker.on_snapshot("MODIFIED", shot("s", "n1", "Ready"))
    broker.on_snapshot("DELETED", shot("s", "n1", "Ready"))  # ended already
    settle(broker)
    assert brokered == ["n1", "n1"]
    assert broker.snapshot_nodes == {}


def test_without_state_keys_snapshots_and_plain_sandboxes_broker_nothing(
    brokered: list[str],
) -> None:
    broker = PullCredentialBroker(object(), Leading(True), "sandlot-system")  # type: ignore[arg-type]
    broker.on_sandbox("ADDED", body("a", "n1"))
    broker.on_snapshot("ADDED", shot("s", "n1", "Taking"))
    settle(broker)
    assert brokered == []
