"""Deleting pushed state from the state repository once nothing names it
(``policy.statedeletion.judge_deletion`` says when; this does the I/O), and the
state keys of owners that are gone (``policy.statekeys``).

The operator deletes, not the nodes: a node holds a credential that pushes and
pulls, and a node that could delete could destroy every tenant's state. The
operator follows every Sandbox (the sandbox feed) and SandboxSnapshot (its kopf
events) and notes, on the event loop, a state a restore cleared from its
sandbox's status, a deleted sandbox's, and a deleted snapshot's pushed copy;
``pass_once``, on a thread of its own and only while leading, lists every Sandbox
and SandboxSnapshot and deletes the digests nothing names (a moved sandbox still
names its state; a snapshot's copy may share a digest). A delete that may pass
is tried again by a later pass; the list is bounded and lives in memory only, so
a deletion while no operator leads, or state whose tries ran out, is left to the
repository's retention rule, and its key is gone anyway: deleting an owner's key
makes every copy of its state unreadable, whatever a registry keeps.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.objects import Objects
from sandlot.adapters.pulling import (
    Credential,
    RegistryClient,
    RegistryError,
    endpoints_for,
)
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.adapters.statekeys import delete_key
from sandlot.api.timestamps import utcnow
from sandlot.controllers.settings import OperatorSettings
from sandlot.policy.pulling import (
    InvalidReference,
    RegistryAccess,
    credential_for,
    parse_reference,
)
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
CALL_TIMEOUT = 10.0
"""Seconds one registry call may take (a delete is four of them at most)."""
KEY_DELETES = 2
"""Passes that delete a gone owner's key (the second finds nothing, unless a racing
brokering made it again)."""
PASS_LIMIT = 8
"""Deletes one pass tries at most (each a read and a bounded registry call)."""

SANDBOXES, SNAPSHOTS = "sandboxes", "sandboxsnapshots"


class ListsEverything(Protocol):
    """Every object of a sandlot kind, as the API server has it now."""

    def list_all(self, plural: str) -> list[dict[str, Any]]: ...


class Forgets(Protocol):
    """The state repository, as the operator's delete credential reaches it."""

    def forget(self, reference: str) -> None: ...


class StateRepository:
    """Deletes pushed state by digest with the operator's own credential (a
    ``.dockerconfigjson`` file); every call bounded. A repository that does not
    delete (405) is said once and left alone from then on."""

    def __init__(
        self,
        repository: str,
        auth_file: str,
        *,
        call_timeout: float,
        private_hosts: frozenset[str] = frozenset(),
    ) -> None:
        self.repository = parse_reference(repository)
        self.auth_file = auth_file
        self.call_timeout = call_timeout
        self.access = RegistryAccess(private_hosts=private_hosts)
        self._no_deletes: set[str] = set()

    def _credential(self, registry: str) -> Credential | None:
        if not self.auth_file:
            return None
        try:
            document = json.loads(Path(self.auth_file).read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("state repository credential %s unreadable: %s", self.auth_file, exc)
            return None
        found = credential_for(registry, [document] if isinstance(document, dict) else [])
        return Credential(*found) if found is not None else None

    def forget(self, reference: str) -> None:
        """Delete the pushed state ``reference`` (``repo:tag@digest``); raises
        ``RegistryError``, ``RuntimeTimeout`` or ``InvalidReference``."""
        ref = parse_reference(reference)
        where = f"{ref.registry}/{ref.repository}"
        if (ref.registry, ref.repository) != (self.repository.registry, self.repository.repository):
            log.warning("%s is not in the state repository %s: left alone", reference, where)
            return
        if not ref.digest or where in self._no_deletes:
            return
        client = RegistryClient(
            endpoints_for(ref, None)[-1],
            ref.repository,
            self._credential(ref.registry),
            connect_timeout=self.call_timeout,
            stall_timeout=self.call_timeout,
            deadline=Deadline(self.call_timeout * 4, expired=RegistryError),
            access=self.access,
        )
        try:
            deleted = client.delete_manifest(ref.digest)
        finally:
            client.close()
        if not deleted:
            self._no_deletes.add(where)
            log.warning(
                "state repository %s does not delete manifests (405): pushed states stay there",
                where,
            )
        else:
            log.info("pushed state %s deleted", reference)


class StateDeletes:
    """The pending deletes of the fleet's pushed states and gone owners' keys, and
    their passes."""

    def __init__(
        self,
        store: Forgets,
        objects: ListsEverything,
        clock: Callable[[], datetime],
        delete_key: Callable[[str], object] = lambda _owner: None,
    ) -> None:
        self.store = store
        self.objects = objects
        self.clock = clock
        self.delete_key = delete_key
        self._pending: list[Pending] = []
        # Owners deleted: their keys go at the next pass, and once more at the one after
        # (a brokering that listed the owner just before it went may have made it again).
        self._keys_gone: list[tuple[str, int]] = []
        self._states: dict[str, PushedState] = {}  # by uid: the state each sandbox names
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def on_sandbox(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A sandbox-feed event (on the loop, no I/O): a state its status no longer
        names (a restore cleared it, or the sandbox was deleted) is noted, and a
        deleted sandbox's key."""
        uid = str((body.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        before = self._states.pop(uid, None)
        if event_type == "DELETED":
            self.deleted(body)
            self._note_key(uid)
            return
        now = pushed_state(body, Because.RESTORED)
        if now is not None:
            self._states[uid] = now
        elif before is not None:
            self._note(before)

    def on_snapshot(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A SandboxSnapshot event: a deleted one's pushed copy and key noted."""
        if event_type != "DELETED":
            return
        self.snapshot_deleted(body)
        uid = (body.get("metadata") or {}).get("uid")
        if uid:
            self._note_key(str(uid))

    def _note_key(self, owner: str, times: int = KEY_DELETES) -> None:
        with self._lock:
            self._keys_gone = [*self._keys_gone, (owner, times)][-MAX_PENDING:]

    def start(self, leading: Callable[[], bool], tick: float = STATE_DELETE_TICK) -> None:
        """Pass every ``tick`` seconds on a thread of its own, while leading."""
        self._stopped = threading.Event()

        def loop() -> None:
            while not self._stopped.wait(tick):
                if not leading():
                    continue
                try:
                    self.pass_once()
                except Exception:  # a pass never ends the loop
                    log.exception("state deletes: the pass failed")

        threading.Thread(target=loop, name="state-deletes", daemon=True).start()

    def close(self) -> None:
        self._stopped.set()

    def pending(self) -> list[Pending]:
        with self._lock:
            return list(self._pending)

    def deleted(self, obj: Mapping[str, Any] | None) -> None:
        """A Sandbox's DELETED event's last body: its pushed state noted for the next
        pass."""
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
            keys, self._keys_gone = self._keys_gone, []
        if due:
            self._attempt(due)
        for owner, times in keys:
            try:
                self.delete_key(owner)
            except Exception as exc:  # tried again at the next pass
                log.warning("state key of %s not deleted: %s", owner, exc)
                self._note_key(owner, times)
            else:
                if times > 1:
                    self._note_key(owner, times - 1)

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


def state_deletes(settings: OperatorSettings, objects: Objects) -> StateDeletes | None:
    """The operator's deletes of pushed state and gone owners' keys; None without a
    state repository."""
    if not settings.state_repository:
        return None
    repository = StateRepository(
        settings.state_repository,
        settings.state_auth_file,
        call_timeout=CALL_TIMEOUT,
        private_hosts=frozenset(settings.state_registry_private_hosts),
    )
    return StateDeletes(
        repository,
        objects,
        utcnow,
        partial(delete_key, objects.api, settings.namespace),
    )


__all__ = [
    "PASS_LIMIT",
    "STATE_DELETE_TICK",
    "Forgets",
    "ListsEverything",
    "StateDeletes",
    "StateRepository",
    "state_deletes",
]
