"""Counting the passes a loop completed, for tests that must prove the loop ran
after a fault before they conclude nothing happened: ``node_passes`` reads the
operator's node-health pass count from its metrics endpoint (the agent counts its
own sync passes: ``sandlot_agent_sync_passes_total``)."""

from __future__ import annotations

import time

from sandlot.agent.main import Agent
from tests.support.operator import OperatorProcess
from tests.support.wait import wait_for

SYNC_PASSES = "sandlot_agent_sync_passes_total"

# Observed once per node-health pass by the operator's work queue (failed passes too).
NODE_PASSES = "sandlot_operator_node_reconcile_duration_seconds_count"


def node_passes(op: OperatorProcess) -> int:
    return int(op.metric(NODE_PASSES))


def wait_node_passes(op: OperatorProcess, base: int, passes: int, *, timeout: float) -> int:
    """Wait until the operator has made ``passes`` node-health passes past ``base``."""
    return wait_for(
        lambda: (n := node_passes(op)) >= base + passes and n,
        timeout=timeout,
        interval=0.1,
        what=f"{passes} node-health passes of the operator past {base}",
    )


def wait_node_passes_after(
    op: OperatorProcess, moment: float, passes: int, *, timeout: float
) -> int:
    """Wait until the monotonic clock reaches ``moment`` (a deadline the test names:
    a grace period run out), then until the operator has made ``passes`` more
    node-health passes: proof that the loop looked at the nodes after it."""
    wait_for(
        lambda: time.monotonic() >= moment,
        timeout=timeout,
        interval=0.1,
        what=f"the moment {moment:.1f} on the monotonic clock",
    )
    return wait_node_passes(op, node_passes(op), passes, timeout=timeout)


def agent_passes(agent: Agent) -> int:
    return int(agent.registry.get_sample_value(SYNC_PASSES) or 0)


def wait_agent_passes(agent: Agent, base: int, passes: int, *, timeout: float) -> int:
    """Wait until ``agent`` has completed ``passes`` sync passes past ``base``."""
    return wait_for(
        lambda: (n := agent_passes(agent)) >= base + passes and n,
        timeout=timeout,
        interval=0.05,
        what=f"{passes} sync passes of the agent past {base}",
    )
