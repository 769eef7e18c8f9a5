"""Deleting pushed state from the state repository once nothing names it
(``policy.statedeletion.judge_deletion`` says when; this does the I/O).

Three ways in: a restore, in its own work item right after the status write that
cleared ``suspendedState`` (tried at once, never holding the restore: every call
is bounded); a deletion of a suspended sandbox, and a deletion of a pushed
SandboxSnapshot, heard on the node's watches (``deleted`` and
``snapshot_deleted`` only note them, on the watch thread) and handled by
``pass_once`` on a loop of its own. Before any delete by digest the agent lists
every Sandbox and SandboxSnapshot (a DELETED event is also what a move to another
node looks like, and a snapshot's copy may share the digest): a digest something
still names is kept for its last referrer. A delete that may pass is tried again
by a later pass; the list is bounded and lives in memory only, so a deletion
while the agent is down, or state whose tries ran out, is left to the
repository's retention rule.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.agent.statestore import StateStore
from sandlot.policy.pulling import InvalidReference
from sandlot.policy.statedeletion import (
    MAX_PENDING,
    Because,
    Pending,
    PushedState,
    Verdict,
    due_now,
    judge_deletions,
    pushed_copy,
    pushed_state,
    queued,
    retry_after_failure,
)

log = logging.getLogger(__name__)

STATE_DELETE_TICK = 5.0
"""Seconds between passes over the pending deletes."""
PASS_LIMIT = 8
"""Deletes one pass tries at most (each a read and a bounded registry call)."""

SANDBOXES, SNAPSHOTS = "sandboxes", "sandboxsnapshots"


class ListsEverything(Protocol):
    """Every object of a sandlot kind, as the API server has it now."""

    def list_all(self, plural: str) -> list[dict[str, Any]]: ...


class StateDeletes:
    """The pending deletes of one agent's pushed states, and their passes."""

    def __init__(
        self, store: StateStore, objects: ListsEverything, clock: Callable[[], datetime]
    ) -> None:
        self.store = store
        self.objects = objects
        self.clock = clock
        self._pending: list[Pending] = []
        self._lock = threading.Lock()

    def pending(self) -> list[Pending]:
        with self._lock:
            return list(self._pending)

    def restored(self, sb: Mapping[str, Any]) -> None:
        """``sb`` (as it was before the restore's write) runs again: its pushed state,
        if any, deleted now; a failure that may pass is kept for a later pass."""
        state = pushed_state(sb, Because.RESTORED)
        if state is not None:
            self._attempt([Pending(state, 0, self.clock())])

    def deleted(self, obj: Mapping[str, Any] | None) -> None:
        """A Sandbox's DELETED event's last body: its pushed state noted for the next
        pass (cheap: this runs on the watch thread)."""
        self._note(pushed_state(obj, Because.DELETED))

    def snapshot_deleted(self, obj: Mapping[str, Any] | None) -> None:
        """A SandboxSnapshot's DELETED event's last body: its pushed copy noted."""
        self._note(pushed_copy(obj))

    def _note(self, state: PushedState | None) -> None:
        if state is None:
            return
        with self._lock:
            self._pending = queued(self._pending, state, self.clock())

    def pass_once(self) -> None:
        with self._lock:
            due = due_now(self._pending, self.clock(), PASS_LIMIT)
            self._pending = [p for p in self._pending if p not in due]
        if due:
            self._attempt(due)

    def _attempt(self, entries: list[Pending]) -> None:
        """Judge ``entries`` on one fresh read of what may name them (read after they
        were noted), then delete those nothing names."""
        try:
            sandboxes = self.objects.list_all(SANDBOXES)
            snapshots = self.objects.list_all(SNAPSHOTS)
        except Exception as exc:  # the API server's refusal or silence: try later
            for entry in entries:
                self._failed(entry, f"cannot read what names it: {exc}")
            return
        judged = judge_deletions([e.state for e in entries], sandboxes, snapshots)
        for entry in entries:
            state, judgement = entry.state, judged[entry.state.reference]
            if judgement.verdict is Verdict.WAIT:
                self._failed(entry, f"named soon, perhaps, by {', '.join(judgement.holders)}")
            elif judgement.verdict is Verdict.KEEP:
                log.info(
                    "%s (%s): pushed state %s kept: still named by %s",
                    state.key,
                    state.because,
                    state.reference,
                    ", ".join(judgement.holders),
                )
            else:
                self._forget(entry)

    def _forget(self, entry: Pending) -> None:
        try:
            self.store.forget(entry.state.reference)
        except (RegistryError, RuntimeTimeout, InvalidReference) as exc:
            self._failed(entry, str(exc))

    def _failed(self, entry: Pending, why: str) -> None:
        state, retry = entry.state, retry_after_failure(entry, self.clock())
        if retry is None:
            log.warning(
                "%s (%s): pushed state %s not deleted, left behind: %s",
                state.key,
                state.because,
                state.reference,
                why,
            )
            return
        log.warning(
            "%s (%s): pushed state %s not deleted, tried again from %s: %s",
            state.key,
            state.because,
            state.reference,
            retry.not_before.isoformat(timespec="seconds"),
            why,
        )
        with self._lock:
            self._pending = [*self._pending, retry][-MAX_PENDING:]


__all__ = ["PASS_LIMIT", "STATE_DELETE_TICK", "ListsEverything", "StateDeletes"]
