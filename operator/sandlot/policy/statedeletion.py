"""When pushed state is deleted from the state repository: by references, not guesses.

A delete goes by digest (``DELETE /v2/<repo>/manifests/<digest>``), and a
registry delete by digest removes every tag naming that manifest. Several things
may name one digest: a suspended sandbox's state (its uid tag), the same state
pushed again, a sandbox moved to another node that still has to pull it (a
snapshot's copy is sealed under its own key, so it shares a digest with nothing
but itself; the rule does not depend on that). So a
candidate (a restore's state, a deleted sandbox's, a deleted snapshot's pushed
copy) is only a candidate: ``judge_deletion`` reads every reference the API
holds (the live Sandboxes' ``status.suspendedState``, the SandboxSnapshots'
``status.pushedImage``, and any snapshot still being taken of the same sandbox,
whose copy may be pushed under that digest) and lets the digest go only when
nothing names it any more. Kept by a settled reference, it is the last
referrer's to delete when it goes; kept by a snapshot being taken, it is tried
again later.

A restore says itself that its sandbox no longer needs the state (the status
write that clears ``suspendedState``). A deletion is heard of on the operator's
watch of every Sandbox; whatever a watch says, a moved Sandbox still naming the
digest is one of its references.

A delete that fails for a reason that may pass is tried again later, backing off,
a bounded number of times, in a bounded list: state left behind costs registry
space, never correctness, and the repository's retention rule is the backstop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sandlot.api.common import key_of, split_key
from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.api.snapshot import TERMINAL_SNAPSHOT_PHASES
from sandlot.policy.backoff import capped_doubling

FIRST_RETRY = timedelta(seconds=10)
LONGEST_RETRY = timedelta(minutes=10)
MAX_ATTEMPTS = 8
"""Deletes of one state tried at most (the first included), then left to retention."""
MAX_PENDING = 256
"""Pushed states waiting for a (re)try at most; past it the oldest is left behind."""


class Because(StrEnum):
    RESTORED = "restored"
    """Its sandbox runs again: the restore's status write cleared it."""
    DELETED = "deleted"
    """Its sandbox was deleted (a move only looks so: then the Sandbox names it)."""
    SNAPSHOT_DELETED = "snapshot-deleted"
    """A SandboxSnapshot pushed there was deleted: its copy goes unless shared."""


@dataclass(frozen=True)
class PushedState:
    reference: str
    """``repository:tag@digest``, as ``status.suspendedState.image`` records it."""
    key: str
    """The sandbox's (or snapshot's) ``namespace/name``."""
    uid: str
    because: Because

    @property
    def digest(self) -> str:
        return self.reference.rsplit("@", 1)[-1]


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


def pushed_copy(obj: Mapping[str, Any] | None) -> PushedState | None:
    """The pushed copy a SandboxSnapshot body records (``status.pushedImage``), None
    when it records none with a digest."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    reference = str((obj.get("status") or {}).get("pushedImage") or "")
    if "@sha256:" not in reference or not meta.get("uid") or not meta.get("name"):
        return None
    return PushedState(reference, key_of(obj), str(meta["uid"]), Because.SNAPSHOT_DELETED)


class Verdict(StrEnum):
    DELETE = "delete"
    """Nothing names its digest: delete it."""
    KEEP = "keep"
    """Something lasting names it (its last referrer deletes it when it goes)."""
    WAIT = "wait"
    """A snapshot of its sandbox is being taken and may push a copy of it: later."""


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    holders: tuple[str, ...] = ()
    """What names the digest, as ``Kind namespace/name``."""


def _digest_of(reference: str) -> str | None:
    return reference.rsplit("@", 1)[-1] if "@sha256:" in reference else None


def _names_digest(state: Mapping[str, Any], digest: str) -> bool:
    return state.get("digest") == digest or _digest_of(str(state.get("image") or "")) == digest


def judge_deletion(
    state: PushedState,
    sandboxes: Iterable[Mapping[str, Any]],
    snapshots: Iterable[Mapping[str, Any]],
) -> Judgement:
    """Whether ``state``'s digest may be deleted, given every Sandbox and
    SandboxSnapshot as the API holds them now (read after the candidate was
    noted). A live (non-terminal) Sandbox whose ``suspendedState`` names the digest
    keeps it (a moved one too); so does a SandboxSnapshot whose ``pushedImage``
    names it (being deleted too: its forks may still pull it); a snapshot of the
    same sandbox not yet Ready or Failed makes it wait."""
    digest = state.digest
    keep: list[str] = []
    wait: list[str] = []
    for sb in sandboxes:
        status = sb.get("status") or {}
        if status.get("phase") in TERMINAL_PHASES:
            continue
        if _names_digest(status.get("suspendedState") or {}, digest):
            keep.append(f"Sandbox {key_of(sb)}")
    namespace, name = split_key(state.key)
    for shot in snapshots:
        status, meta = shot.get("status") or {}, shot.get("metadata") or {}
        if _digest_of(str(status.get("pushedImage") or "")) == digest:
            keep.append(f"SandboxSnapshot {key_of(shot)}")
        elif (
            state.because is not Because.SNAPSHOT_DELETED
            and meta.get("namespace") == namespace
            and (shot.get("spec") or {}).get("sandboxName") == name
            and status.get("phase") not in TERMINAL_SNAPSHOT_PHASES
            and not meta.get("deletionTimestamp")
        ):
            wait.append(f"SandboxSnapshot {key_of(shot)} (being taken)")
    if keep:
        return Judgement(Verdict.KEEP, tuple(sorted(keep)))
    if wait:
        return Judgement(Verdict.WAIT, tuple(sorted(wait)))
    return Judgement(Verdict.DELETE)


def judge_deletions(
    states: Iterable[PushedState],
    sandboxes: Iterable[Mapping[str, Any]],
    snapshots: Iterable[Mapping[str, Any]],
) -> dict[str, Judgement]:
    """``judge_deletion`` of each candidate, by reference: which digests may go."""
    sandboxes, snapshots = list(sandboxes), list(snapshots)
    return {s.reference: judge_deletion(s, sandboxes, snapshots) for s in states}


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
    wait = capped_doubling(attempts, FIRST_RETRY, LONGEST_RETRY)
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
    "Judgement",
    "Pending",
    "PushedState",
    "Verdict",
    "due_now",
    "judge_deletion",
    "judge_deletions",
    "pushed_copy",
    "pushed_state",
    "queued",
    "retry_after_failure",
]
