"""When a suspended sandbox's pushed state is deleted from the state repository.

Pushed state (``status.suspendedState``) is needed until a restore has recorded
it is running again, or until the Sandbox is gone. A restore says so itself
(the status write that clears ``suspendedState``). A deletion is only heard of:
the node's watch delivers DELETED with the last body it held, but a watch
filtered on ``spec.nodeName`` says DELETED too when the scheduler moves the
sandbox to another node, whose restore needs that very state. So a DELETED
event is a candidate only; the Sandbox is read again, and its state is due for
deletion when no Sandbox of that name, or only one of another uid, exists.

A delete that fails for a reason that may pass is tried again later, backing off,
a bounded number of times, in a bounded list: state left behind costs registry
space, never correctness, and the repository's retention rule is the backstop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sandlot.api.common import key_of

FIRST_RETRY = timedelta(seconds=10)
LONGEST_RETRY = timedelta(minutes=10)
MAX_ATTEMPTS = 8
"""Deletes of one state tried at most (the first included), then left to retention."""
MAX_PENDING = 256
"""Pushed states waiting for a (re)try at most; past it the oldest is left behind."""


class Because(StrEnum):
    RESTORED = "restored"
    """Its sandbox runs again: the restoring agent's status write cleared it."""
    DELETED = "deleted"
    """Its sandbox's node heard of a deletion: due only once the Sandbox is gone."""


@dataclass(frozen=True)
class PushedState:
    reference: str
    """``repository:tag@digest``, as ``status.suspendedState.image`` records it."""
    key: str
    """The sandbox's ``namespace/name``."""
    uid: str
    because: Because


@dataclass(frozen=True)
class Pending:
    state: PushedState
    attempts: int
    """Deletes tried so far."""
    not_before: datetime


def pushed_state(obj: Mapping[str, Any] | None, because: Because) -> PushedState | None:
    """The pushed state ``obj`` (a Sandbox body) records, None when it records none or
    one without a digest (nothing exact to delete)."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    reference = str(((obj.get("status") or {}).get("suspendedState") or {}).get("image") or "")
    if "@sha256:" not in reference or not meta.get("uid") or not meta.get("name"):
        return None
    return PushedState(reference, key_of(obj), str(meta["uid"]), because)


def deletion_due(state: PushedState, current: Mapping[str, Any] | None) -> bool:
    """Whether ``state`` may be deleted, given its Sandbox as read now (None: not
    found). A restore's state is due at once; a deletion's once no Sandbox of that
    uid exists (one of the same uid was moved to another node, whose agent
    restores it from that state or deletes it when the Sandbox goes)."""
    if state.because is Because.RESTORED:
        return True
    if current is None:
        return True
    return str((current.get("metadata") or {}).get("uid") or "") != state.uid


def queued(pending: Sequence[Pending], state: PushedState, now: datetime) -> list[Pending]:
    """``pending`` with ``state`` due now (once: a state already there is kept as it
    is); past ``MAX_PENDING`` the oldest entries are dropped."""
    if any(p.state.reference == state.reference for p in pending):
        return list(pending)
    return [*pending, Pending(state, 0, now)][-MAX_PENDING:]


def retry_after_failure(entry: Pending, now: datetime) -> Pending | None:
    """``entry`` after a failed delete: tried again after 10 s, doubling to at most 10
    minutes; None once ``MAX_ATTEMPTS`` were made (left behind)."""
    attempts = entry.attempts + 1
    if attempts >= MAX_ATTEMPTS:
        return None
    wait = min(FIRST_RETRY * (2 ** (attempts - 1)), LONGEST_RETRY)
    return replace(entry, attempts=attempts, not_before=now + wait)


def due_now(pending: Sequence[Pending], now: datetime, limit: int) -> list[Pending]:
    """The entries whose time has come, oldest first, at most ``limit`` (a pass's
    bound: each is a read and a registry call)."""
    return [p for p in pending if p.not_before <= now][:limit]


__all__ = [
    "FIRST_RETRY",
    "LONGEST_RETRY",
    "MAX_ATTEMPTS",
    "MAX_PENDING",
    "Because",
    "Pending",
    "PushedState",
    "deletion_due",
    "due_now",
    "pushed_state",
    "queued",
    "retry_after_failure",
]
