"""What purge waits for: sandboxes still live on nodes whose agent renews its Lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.policy.purge import AgentLease, SandboxRef, awaiting_stop, live_agents

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("renewed_ago", "duration", "live"),
    [
        (timedelta(seconds=5), 60, True),
        (timedelta(seconds=60), 60, False),
        (timedelta(seconds=61), 60, False),
        (None, 60, False),
        (timedelta(seconds=-2), 10, True),
    ],
    ids=[
        "renewed-within-duration-is-live",
        "expiring-exactly-now-is-not-live",
        "expired-is-not-live",
        "never-renewed-is-not-live",
        "renewed-by-a-clock-slightly-ahead-is-live",
    ],
)
def test_an_agent_is_live_while_its_lease_is_unexpired(
    renewed_ago: timedelta | None, duration: int, live: bool
) -> None:
    renew = None if renewed_ago is None else NOW - renewed_ago
    got = live_agents({"n1": AgentLease(renew_time=renew, duration_seconds=duration)}, NOW)
    assert ("n1" in got) is live


@pytest.mark.parametrize(
    ("sandbox", "waited_for"),
    [
        (SandboxRef("ns/a", "n1", "Running"), True),
        (SandboxRef("ns/a", "n1", "Scheduled"), True),
        (SandboxRef("ns/a", "n1", None), True),
        (SandboxRef("ns/a", "n1", "Stopped"), False),
        (SandboxRef("ns/a", "n1", "Failed"), False),
        (SandboxRef("ns/a", "n1", "Dead"), False),
        (SandboxRef("ns/a", None, "Pending"), False),
        (SandboxRef("ns/a", "lost", "Running"), False),
    ],
    ids=[
        "running-on-a-live-node-is-waited-for",
        "scheduled-on-a-live-node-is-waited-for",
        "no-status-yet-on-a-live-node-is-waited-for",
        "stopped-is-done",
        "failed-is-done",
        "dead-is-done",
        "unscheduled-has-no-container",
        "running-on-a-node-without-agent-is-not-waited-for",
    ],
)
def test_purge_waits_only_for_what_a_live_agent_can_stop(
    sandbox: SandboxRef, waited_for: bool
) -> None:
    assert awaiting_stop([sandbox], frozenset({"n1"})) == (["ns/a"] if waited_for else [])


def test_waited_for_sandboxes_are_listed_sorted() -> None:
    refs = [SandboxRef(k, "n1", "Running") for k in ("b/x", "a/y", "a/x")]
    assert awaiting_stop(refs, frozenset({"n1"})) == ["a/x", "a/y", "b/x"]
