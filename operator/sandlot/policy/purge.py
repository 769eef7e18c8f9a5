"""What ``sandlot purge --workloads`` still waits for before it deletes sandboxes.

A Sandbox deleted while its container runs is stopped by its node's agent some
time later, and nothing in the API says when: if the agents are removed in that
window (``helm uninstall`` deletes the DaemonSet right after its pre-delete hook),
the containers keep running on the nodes with nobody left to stop them. So purge
drains first: every node is cordoned, each live agent stops its sandboxes and
writes ``Stopped`` only after the teardown, and purge deletes once no sandbox is
still live on a node whose agent can act. A node whose lease has expired has no
agent to wait for; its sandboxes are deleted as they are (a returning agent's
orphan sweep removes their containers).

Pure: the lease times and ``now`` come in, nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sandlot.api.sandbox import TERMINAL_PHASES


@dataclass(frozen=True)
class AgentLease:
    """An agent's node Lease as purge reads it once.

    Purge is a one-shot command that waits for agents to stop their sandboxes, so it
    judges their Leases against its own clock at the moment it reads them; the
    operator's observed-renewal view is not available to it. A skewed agent clock
    can only make purge wait for an agent that is gone (until its timeout) or delete
    a sandbox whose agent is alive without waiting for the stop (its container is
    then an orphan the agent's sweep removes).
    """

    renew_time: datetime | None
    duration_seconds: int


@dataclass(frozen=True)
class SandboxRef:
    """What purge needs to know of one Sandbox."""

    key: str
    """``namespace/name``."""
    node: str | None
    """``spec.nodeName``; None while unscheduled (it has no container anywhere)."""
    phase: str | None
    """``status.phase``; None before anything wrote a status."""


def live_agents(leases: Mapping[str, AgentLease], now: datetime) -> frozenset[str]:
    """Nodes whose agent's Lease is unexpired at ``now`` (the Lease is named after the node)."""
    return frozenset(
        name
        for name, lease in leases.items()
        if lease.renew_time is not None
        and now.timestamp() < lease.renew_time.timestamp() + lease.duration_seconds
    )


def awaiting_stop(sandboxes: Iterable[SandboxRef], live: frozenset[str]) -> list[str]:
    """Keys of the sandboxes whose container a live agent has yet to stop, sorted."""
    return sorted(
        sb.key
        for sb in sandboxes
        if sb.node is not None and sb.node in live and sb.phase not in TERMINAL_PHASES
    )
