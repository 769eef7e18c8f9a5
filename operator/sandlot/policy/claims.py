"""What to do about a SandboxClaim now: a pure decision.

A claim is bound to one Ready member of its pool (Running, its readiness probe
passed, not paused), the one that has been warm longest (it has proved it runs); the binding itself
is one write to the sandbox
(guarded by its resourceVersion, so two claims never take the same one), then the
claim's status says where it is. A claim whose sandbox ended or went away is
``Lost``: it is not bound again (its user may hold state in the lost one; they
delete the claim and make a new one).

A claim's ``spec.lifecycle`` ends it (``decide_claim_end``): at ``shutdownTime``
policy ``Delete`` deletes the claim and its sandbox, ``Retain`` stops the sandbox
(reason ``ClaimExpired``) and makes the claim ``Expired``, a final phase that
binding leaves alone. A ``Lost`` or ``Expired`` claim with a TTL is deleted with
its sandbox at ``finishedAt`` + TTL (``policy.lifetimes.after_finish``), its
``finishedAt`` written first when missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sandlot.api.claim import FINAL_CLAIM_PHASES, ClaimPhase
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.api.timestamps import rfc3339
from sandlot.policy.lifetimes import after_finish


@dataclass(frozen=True)
class Candidate:
    """A sandbox as the claim controller sees it: a pool member, or the claim's own."""

    name: str
    phase: str
    created_at: datetime
    ip: str | None = None
    node: str | None = None
    paused: bool = False  # frozen: a program given it would wait on its first command
    ready: bool = True  # its readiness probe passed (or it has none)


class ClaimAction(StrEnum):
    NONE = "none"
    BIND = "bind"
    STATUS = "status"


@dataclass(frozen=True)
class ClaimDecision:
    action: ClaimAction
    sandbox: str | None = None
    """The member to bind (BIND)."""
    status: Mapping[str, object] = field(default_factory=dict)
    """The claim's status to write (STATUS), without timestamps."""


def _differs(current: Mapping[str, object], wanted: Mapping[str, object]) -> bool:
    return any(current.get(k) != v for k, v in wanted.items())


def bound_status(sandbox: Candidate) -> dict[str, object]:
    """What a claim bound to ``sandbox`` says (without its timestamp)."""
    return {
        "phase": ClaimPhase.BOUND.value,
        "sandboxName": sandbox.name,
        "address": sandbox.ip,
        "nodeName": sandbox.node,
    }


def decide_claim(
    status: Mapping[str, object],
    bound: Candidate | None,
    pool_exists: bool,
    members: Iterable[Candidate],
    pool_name: str,
) -> ClaimDecision:
    """``status``: the claim's current status; ``bound``: the sandbox bound to it, if
    any; ``members``: the pool's members (any phase)."""
    if status.get("phase") == ClaimPhase.EXPIRED.value:
        return ClaimDecision(ClaimAction.NONE)  # final: its lifecycle ended it
    if bound is not None:
        if bound.phase in TERMINAL_PHASES:
            wanted: dict[str, object] = {
                "phase": ClaimPhase.LOST.value,
                "sandboxName": bound.name,
                "message": f"sandbox {bound.name} ended {bound.phase}",
            }
        else:
            wanted = bound_status(bound)
        if _differs(status, wanted):
            return ClaimDecision(ClaimAction.STATUS, status=wanted)
        return ClaimDecision(ClaimAction.NONE)
    if status.get("phase") in (ClaimPhase.BOUND.value, ClaimPhase.LOST.value):
        wanted = {
            "phase": ClaimPhase.LOST.value,
            "message": f"sandbox {status.get('sandboxName')} was deleted",
        }
        if _differs(status, wanted):
            return ClaimDecision(ClaimAction.STATUS, status=wanted)
        return ClaimDecision(ClaimAction.NONE)
    running = sorted(
        (m for m in members if m.phase == SandboxPhase.RUNNING and m.ready and not m.paused),
        key=lambda m: (m.created_at, m.name),
    )
    if running:
        return ClaimDecision(ClaimAction.BIND, sandbox=running[0].name)
    message = (
        f"no Ready member in pool {pool_name} yet"
        if pool_exists
        else f"pool {pool_name} does not exist"
    )
    wanted = {"phase": ClaimPhase.PENDING.value, "message": message}
    if _differs(status, wanted):
        return ClaimDecision(ClaimAction.STATUS, status=wanted)
    return ClaimDecision(ClaimAction.NONE)


@dataclass(frozen=True)
class ClaimLifecycle:
    """A claim's ``spec.lifecycle`` as data."""

    shutdown_time: datetime | None = None
    delete: bool = False
    """shutdownPolicy Delete (else Retain)."""
    ttl_seconds: int | None = None


NO_LIFECYCLE = ClaimLifecycle()


class EndAction(StrEnum):
    NONE = "none"
    DELETE = "delete"
    """Delete the claim and its sandbox."""
    EXPIRE = "expire"
    """Stop its sandbox (ClaimExpired); the claim becomes Expired."""
    STAMP = "stamp"
    """Write the missing ``finishedAt`` (now), from which its TTL counts."""


@dataclass(frozen=True)
class ClaimEnd:
    action: EndAction
    wait_seconds: float | None = None
    """Seconds until its shutdownTime or TTL (NONE only); None: nothing to wait for."""
    message: str = ""


def decide_claim_end(
    phase: str | None, lifecycle: ClaimLifecycle, finished_at: datetime | None, now: datetime
) -> ClaimEnd:
    """What a claim in ``phase`` with ``lifecycle`` needs now on the operator's clock."""
    if phase in FINAL_CLAIM_PHASES:
        due = after_finish(finished_at, lifecycle.ttl_seconds, now, what=str(phase))
        if due.stamp_first:
            return ClaimEnd(EndAction.STAMP)
        if due.now:
            return ClaimEnd(EndAction.DELETE, message=due.message)
        return ClaimEnd(EndAction.NONE, wait_seconds=due.wait_seconds)
    if lifecycle.shutdown_time is None:
        return ClaimEnd(EndAction.NONE)
    if now < lifecycle.shutdown_time:
        return ClaimEnd(
            EndAction.NONE, wait_seconds=(lifecycle.shutdown_time - now).total_seconds()
        )
    message = f"claim ended at its shutdownTime {rfc3339(lifecycle.shutdown_time, 'seconds')}"
    return ClaimEnd(EndAction.DELETE if lifecycle.delete else EndAction.EXPIRE, message=message)


__all__ = [
    "NO_LIFECYCLE",
    "Candidate",
    "ClaimAction",
    "ClaimDecision",
    "ClaimEnd",
    "ClaimLifecycle",
    "EndAction",
    "bound_status",
    "decide_claim",
    "decide_claim_end",
]


def hold_replacements(unbound: int, starved: int) -> bool:
    """Whether a pool's reaction (its replacements, its status) waits for its claims.

    Claims first: while claims of the pool are still unbound and every one of them
    has a member to take, replacing the members they take would only compete with
    their binds for the API server (a replacement costs it more writes than a
    bind: the create, the schedule, the start). Once any claim finds no member,
    the pool must grow now, so nothing waits.
    """
    return unbound > 0 and starved == 0
