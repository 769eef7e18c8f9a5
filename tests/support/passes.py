"""Counting the passes a loop completed, for tests that must prove the loop ran
after a fault before they conclude nothing happened.

``count_passes`` wraps one bound step of an in-process program (the agent's sync
pass) before its loop is started; ``node_passes`` reads the operator's node-health
pass count from its metrics endpoint."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tests.support.operator import OperatorProcess
from tests.support.wait import wait_for

# Observed once per node-health pass by the operator's work queue (failed passes too).
NODE_PASSES = "sandlot_operator_node_reconcile_duration_seconds_count"


class PassCounter:
    """How many calls of a step returned normally (a pass that raised is not counted:
    it did not get through)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            with self._lock:
                self._count += 1
            return result

        return counted

    def wait_past(self, base: int, passes: int, *, timeout: float, what: str) -> int:
        """Wait until ``passes`` more than ``base`` have completed; returns the count."""
        return wait_for(
            lambda: self.count if self.count >= base + passes else None,
            timeout=timeout,
            interval=0.05,
            what=f"{passes} {what} after the fault (count was {base})",
        )


def count_passes(owner: object, step: str) -> PassCounter:
    """Count completed calls of ``owner.step`` from now on; call before the loop that
    calls it takes the bound method."""
    counter = PassCounter()
    setattr(owner, step, counter.wrap(getattr(owner, step)))
    return counter


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
