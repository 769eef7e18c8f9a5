"""Pushing a suspended sandbox's state again after a push that failed: pure.

A suspend commits first and pushes after; a push the registry refuses for a
reason that may pass (down, unreachable, a stall, a 5xx) leaves the sandbox
suspended on its node with its push owed. That debt is written down, not kept in
memory: the ``Suspended`` condition's reason says ``PushPending`` (or
``IdlePushPending`` for one its agent suspended for being idle), so a restarted
agent pushes again at once, and a drain does not end a sandbox whose state may
still leave the node. Retries back off as a restore's pull does
(``policy.suspension.next_pull_retry``: 5 s doubling to 5 minutes, in the
agent's memory). A refusal that will not pass (denied, not found, too large, the
node's own content missing) ends the debt: the state stays on its node, as a
suspension without a repository does.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sandlot.api.common import Condition
from sandlot.api.reasons import ConditionType, SuspendedReason
from sandlot.policy.pulling.decision import FINAL_KINDS, FailureKind
from sandlot.policy.suspension import PullRetry

PUSH_PENDING_REASONS = frozenset({SuspendedReason.PUSH_PENDING, SuspendedReason.IDLE_PUSH_PENDING})


def push_may_pass(kind: FailureKind | None) -> bool:
    """Whether a failed push is worth another try: ``kind`` is the registry's
    failure (None: no answer in time from the registry or the node's store)."""
    return kind is None or kind not in FINAL_KINDS


def push_pending(obj: Mapping[str, Any]) -> bool:
    """The sandbox is suspended with its push owed (and nothing pushed since)."""
    status = obj.get("status") or {}
    if status.get("suspendedState"):
        return False
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.SUSPENDED:
            return c.get("status") == "True" and c.get("reason") in PUSH_PENDING_REASONS
    return False


def push_pending_note(error: str, retry: PullRetry, now: datetime) -> str:
    """What the condition says of a push owed: why, and when it is tried again."""
    seconds = max(0.0, (retry.not_before - now).total_seconds())
    return (
        f"not pushed yet ({error}): tried again in {seconds:g}s (failure {retry.failures}); "
        "it stays on this node meanwhile"
    )


def owing(condition: Condition) -> Condition:
    """``condition`` (a suspend's, or an idle suspend's) saying its push is owed."""
    idle = condition.reason in (SuspendedReason.IDLE, SuspendedReason.IDLE_PUSH_PENDING)
    reason = SuspendedReason.IDLE_PUSH_PENDING if idle else SuspendedReason.PUSH_PENDING
    return condition.model_copy(update={"reason": reason})


def settled(condition: Condition) -> Condition:
    """``condition`` once the push is done or given up: its plain reason again."""
    idle = condition.reason in (SuspendedReason.IDLE, SuspendedReason.IDLE_PUSH_PENDING)
    reason = SuspendedReason.IDLE if idle else SuspendedReason.SUSPENDED
    return condition.model_copy(update={"reason": reason})


__all__ = [
    "PUSH_PENDING_REASONS",
    "owing",
    "push_may_pass",
    "push_pending",
    "push_pending_note",
    "settled",
]
