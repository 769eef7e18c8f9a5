"""Whether a sandbox's start pulls its image, waits, backs off or fails: a pure decision.

The kubelet's meaning of ``imagePullPolicy``: ``IfNotPresent`` pulls only an image
the node lacks, ``Always`` resolves the reference again for every start (a moved
tag is pulled, an unchanged one costs a manifest request), ``Never`` uses only
what the node has. Failed pulls are retried after an exponential back-off (10 s
doubling to 5 min, as the kubelet's ``ImagePullBackOff``), so a broken reference
never makes a hot loop against a registry. A failure the registry calls final (no
such image, a refused credential) ends the sandbox ``Failed`` once it has
happened ``final_attempts`` times in a row; anything else (a stall, a registry
that is down) is retried for as long as the sandbox exists.

The history of pulls is per (image, credential identity) and kept in memory by
the agent (what the kubelet does too): one tenant's failures never back off or
fail another's sandboxes of the same image; after an agent restart a failing
image starts its back-off from the beginning, which costs one request. An image
the node has but the sandbox's credential has not been seen to reach
(``policy.pulling.credentials``) is verified first: one manifest request, with the same
back-off and final failures as a pull.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sandlot.api.reasons import SandboxReason
from sandlot.policy.backoff import capped_doubling


class PullPolicy(StrEnum):
    IF_NOT_PRESENT = "IfNotPresent"
    ALWAYS = "Always"
    NEVER = "Never"


class FailureKind(StrEnum):
    NOT_FOUND = "not_found"
    """The registry has no such repository, tag or digest."""
    UNAUTHORIZED = "unauthorized"
    """The registry refused the credential (or wants one and none was given)."""
    TRANSIENT = "transient"
    """Anything that may pass: a stall, a timeout, a registry that is down."""
    TOO_LARGE = "too_large"
    """A manifest, index or config past its cap (``policy.imagecaps``): a hostile image."""


FINAL_KINDS: frozenset[FailureKind] = frozenset(
    {FailureKind.NOT_FOUND, FailureKind.UNAUTHORIZED, FailureKind.TOO_LARGE}
)

BACKOFF_BASE = timedelta(seconds=10)
BACKOFF_CAP = timedelta(minutes=5)
FINAL_ATTEMPTS = 3


def pull_backoff(
    failures: int, *, base: timedelta = BACKOFF_BASE, cap: timedelta = BACKOFF_CAP
) -> timedelta:
    """The wait after ``failures`` consecutive failed pulls: ``base`` doubling, at most
    ``cap``; none before the first failure."""
    if failures <= 0:
        return timedelta(0)
    return capped_doubling(failures, base, cap)


@dataclass(frozen=True)
class PullHistory:
    """What the agent remembers of one image's pulls."""

    failures: int = 0
    """Consecutive failed pulls since the last success."""
    last_failed_at: datetime | None = None
    last_kind: FailureKind | None = None
    last_message: str = ""
    final_failures: int = 0
    """Consecutive failures of a final kind (not found, unauthorized)."""
    succeeded_at: datetime | None = None
    """When the last pull of this image succeeded."""
    in_flight: bool = False
    started: int = 0
    """Pulls of this image started so far: the number of the latest one."""
    succeeded_pull: int = 0
    """The number of the last pull that succeeded (0: none)."""

    def failed(self, kind: FailureKind, message: str, now: datetime) -> PullHistory:
        final = self.final_failures + 1 if kind in FINAL_KINDS else 0
        return PullHistory(
            failures=self.failures + 1,
            last_failed_at=now,
            last_kind=kind,
            last_message=message,
            final_failures=final,
            succeeded_at=self.succeeded_at,
            started=self.started,
            succeeded_pull=self.succeeded_pull,
        )

    def succeeded(self, now: datetime) -> PullHistory:
        return PullHistory(succeeded_at=now, started=self.started, succeeded_pull=self.started)


class PullAction(StrEnum):
    RUN = "run"
    """Create the container from the image the node has."""
    PULL = "pull"
    """Start a pull (status ``Pulling``)."""
    WAIT = "wait"
    """A pull of this image is in flight: report its progress."""
    BACK_OFF = "back-off"
    """The last pull failed and its back-off has not passed (``ImagePullBackOff``)."""
    FAIL = "fail"
    """End the sandbox ``Failed``."""
    VERIFY = "verify"
    """Check the sandbox's own credential against the registry before running the
    image the node has (status ``Pulling`` meanwhile)."""


@dataclass(frozen=True)
class PullDecision:
    action: PullAction
    reason: str = ""
    message: str = ""
    retry_at: datetime | None = None


def decide_pull(
    policy: PullPolicy,
    *,
    present: bool,
    history: PullHistory,
    joined: int | None,
    now: datetime,
    verified: bool = True,
    final_attempts: int = FINAL_ATTEMPTS,
    base: timedelta = BACKOFF_BASE,
    cap: timedelta = BACKOFF_CAP,
) -> PullDecision:
    """What a start does about its image.

    ``present``: the node has the image. ``joined``: the number of the pull this
    sandbox started or joined, if any; under ``Always`` only a pull it started or
    joined counts as its pull (sandboxes of one image share one), never one that
    finished before it asked (a creation time, in whole seconds, cannot tell).
    ``verified``: the sandbox's credential may use the image the node has
    (``policy.pulling.credentials``); if not, a present image is verified (with the
    back-off of a pull) before it runs, under every pull policy.
    """
    if history.in_flight:
        return PullDecision(PullAction.WAIT, SandboxReason.PULLING)
    if policy is PullPolicy.NEVER:
        if present and verified:
            return PullDecision(PullAction.RUN)
        if present:
            return _retry_or(PullAction.VERIFY, history, now, final_attempts, base, cap)
        return PullDecision(
            PullAction.FAIL,
            SandboxReason.IMAGE_NOT_FOUND,
            "the image is not on the node and imagePullPolicy is Never",
        )
    pulled_for_it = joined is not None and history.succeeded_pull >= joined
    if present and (policy is PullPolicy.IF_NOT_PRESENT or pulled_for_it):
        if verified or pulled_for_it:
            return PullDecision(PullAction.RUN)
        return _retry_or(PullAction.VERIFY, history, now, final_attempts, base, cap)
    return _retry_or(PullAction.PULL, history, now, final_attempts, base, cap)


def _final_reason(history: PullHistory) -> SandboxReason:
    """A hostile image ends as the USER lookup's cap does, whichever read met the cap."""
    if history.last_kind is FailureKind.TOO_LARGE:
        return SandboxReason.IMAGE_TOO_LARGE
    return SandboxReason.ERR_IMAGE_PULL


def _retry_or(
    action: PullAction,
    history: PullHistory,
    now: datetime,
    final_attempts: int,
    base: timedelta,
    cap: timedelta,
) -> PullDecision:
    """``action`` unless the last failures end the sandbox or their back-off holds."""
    if history.failures and history.last_failed_at is not None:
        if history.final_failures >= final_attempts:
            return PullDecision(PullAction.FAIL, _final_reason(history), history.last_message)
        retry_at = history.last_failed_at + pull_backoff(history.failures, base=base, cap=cap)
        if now < retry_at:
            return PullDecision(
                PullAction.BACK_OFF,
                SandboxReason.IMAGE_PULL_BACK_OFF,
                history.last_message,
                retry_at,
            )
    return PullDecision(action, SandboxReason.PULLING)


__all__ = [
    "FINAL_ATTEMPTS",
    "FailureKind",
    "PullAction",
    "PullDecision",
    "PullHistory",
    "PullPolicy",
    "decide_pull",
    "pull_backoff",
]
