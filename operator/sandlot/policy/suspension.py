"""Suspending a sandbox (``spec.operatingMode: Suspended``) and bringing it back: pure.

A suspended sandbox stays phase Running on its node (its claim and node are its
own still) and says so with its ``Suspended`` condition, as a paused one does
with ``Paused``: nothing that keys on the phase learns a new one. Its filesystem
is committed to an image on its node (``suspended_image_name``), its container
removed. The order makes every crash safe: the condition is written after the
commit and before the container is removed, so a Running sandbox without a
container is lost only when its condition does not say Suspended.

``decide_suspension`` reads what the spec asks, what the condition records and
whether the container exists, and says which step is due (None: not this
module's business, the pause logic or the lost-container rule applies):

==========  =========  =========  ========================================
mode        recorded   container  step
==========  =========  =========  ========================================
Suspended   no         yes        COMMIT (then record, then remove)
Suspended   yes        yes        REMOVE (a crash left it)
Suspended   yes        no         NONE
Suspended   no         no         None (lost, unless the record lags)
other       yes        no         RESTORE (a new container from the image)
other       yes        yes        RECORD_RESTORED (a crash left it unsaid)
other       no         any        None (the pause logic)
==========  =========  =========  ========================================

A commit or restore the runtime refused is recorded with the spec's generation
and not tried again until the spec changes (``NONE``), as a refused pause is.

The committed image is held by the image collector while its Sandbox lives on
the node, and removed by its next pass once the Sandbox is deleted or has ended
(``orphaned_images``). That removes one name: containerd keeps the manifest,
layers and unpacked snapshots while any image record still names them (a
snapshot's copy of the same manifest, a fork's pulled copy), so nothing another
name references goes with it. A restore that finds its image gone pulls it when
it was pushed (``restore_pull``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sandlot.api.common import Condition
from sandlot.api.reasons import ConditionType, SuspendedReason
from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode
from sandlot.policy.backoff import capped_doubling

SUSPENDED_IMAGE_PREFIX = "sandlot.local/suspended/"
SUSPENDED_IMAGE_LABEL = "sandlot.dev/suspended"
"""On a committed image: the Sandbox's "namespace/name"."""
FAILURE_REASONS = frozenset({SuspendedReason.SUSPEND_FAILED, SuspendedReason.RESTORE_FAILED})


class SuspendStep(StrEnum):
    COMMIT = "commit"
    REMOVE = "remove"
    RESTORE = "restore"
    RECORD_RESTORED = "record-restored"
    NONE = "none"
    """Nothing to do now."""


def suspended_image_name(uid: str) -> str:
    """The image a suspended sandbox's filesystem is committed to on its node."""
    return f"{SUSPENDED_IMAGE_PREFIX}{uid}:latest"


def is_suspended_image(name: str) -> bool:
    """An image sandlot committed for a suspended sandbox (never collected by age)."""
    return name.startswith(SUSPENDED_IMAGE_PREFIX)


def image_uid(name: str) -> str | None:
    """The Sandbox uid a committed image belongs to (None: not a committed image)."""
    if not is_suspended_image(name):
        return None
    return name[len(SUSPENDED_IMAGE_PREFIX) :].rsplit(":", 1)[0]


def orphaned_images(names: Iterable[str], live_uids: Collection[str] | None) -> list[str]:
    """Committed images whose Sandbox is gone from this node or has ended: its state
    serves nobody. ``live_uids``: the uids of the node's non-terminal Sandboxes;
    None (not known yet) orphans nothing."""
    if live_uids is None:
        return []
    return sorted(n for n in names if (uid := image_uid(n)) is not None and uid not in live_uids)


def live_uids(sandboxes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The uids of the Sandboxes given (a node's) that have not ended."""
    return frozenset(
        str(o["metadata"]["uid"])
        for o in sandboxes
        if (o.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )


def _condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.SUSPENDED:
            return c
    return None


def recorded_suspended(obj: Mapping[str, Any]) -> bool:
    """The ``Suspended`` condition is True: its filesystem is committed (its
    container is gone, or going)."""
    condition = _condition(obj)
    return condition is not None and condition.get("status") == "True"


def idle_suspended(obj: Mapping[str, Any]) -> bool:
    """Its agent suspended it for being idle (``spec.idleAction: Suspend``): the
    ``Suspended`` condition True with reason ``Idle`` while the spec asks for Running."""
    condition = _condition(obj)
    return (
        condition is not None
        and condition.get("status") == "True"
        and condition.get("reason") in (SuspendedReason.IDLE, SuspendedReason.IDLE_PUSH_PENDING)
    )


def held_mode(mode: OperatingMode, idle: bool, waking: bool) -> OperatingMode:
    """The mode the node holds a sandbox to: ``mode`` (its spec's), but one its agent
    suspended for being idle (``idle``) stays suspended, settled as an idle pause is,
    until a use wakes it (``waking``: an exec, files call, port-forward or claim)."""
    if mode is OperatingMode.RUNNING and idle and not waking:
        return OperatingMode.SUSPENDED
    return mode


def suspend_failed(obj: Mapping[str, Any]) -> bool:
    """The last suspend or restore was refused for this very spec."""
    condition = _condition(obj)
    if condition is None or condition.get("reason") not in FAILURE_REASONS:
        return False
    generation = (obj.get("metadata") or {}).get("generation")
    return generation is not None and condition.get("observedGeneration") == generation


def decide_suspension(
    mode: OperatingMode, suspended: bool, has_container: bool, failed: bool
) -> SuspendStep | None:
    """The step due (the table above); None: not a suspension matter."""
    if mode is OperatingMode.SUSPENDED:
        if suspended:
            return SuspendStep.REMOVE if has_container else SuspendStep.NONE
        if not has_container:
            return None
        return SuspendStep.NONE if failed else SuspendStep.COMMIT
    if not suspended:
        return None
    if has_container:
        return SuspendStep.RECORD_RESTORED
    return SuspendStep.NONE if failed else SuspendStep.RESTORE


def suspension_outcome(obj: Mapping[str, Any], mode: OperatingMode) -> str | None:
    """As ``operatingmode.mode_outcome`` for the Suspended condition: None not yet,
    ``"applied"`` when it records ``mode``, else the runtime's refusal."""
    condition = _condition(obj)
    if suspend_failed(obj) and condition is not None:
        return str(condition.get("message") or condition.get("reason"))
    if mode is OperatingMode.RUNNING and idle_suspended(obj):
        return "applied"  # as an idle pause: its next use starts it again
    return "applied" if recorded_suspended(obj) == (mode is OperatingMode.SUSPENDED) else None


def suspended_condition(
    suspending: bool,
    node: str,
    generation: int | None,
    error: str | None = None,
    pushed: str | None = None,
) -> Condition:
    """The condition after a suspend (``suspending``) or a restore on ``node``;
    ``error``: the runtime refused (then the sandbox is as it was); ``pushed``: what
    became of the push of a suspend's state (where it went, or why it did not)."""
    if error is not None:
        return Condition(
            type=ConditionType.SUSPENDED,
            status="False" if suspending else "True",
            reason=SuspendedReason.SUSPEND_FAILED if suspending else SuspendedReason.RESTORE_FAILED,
            message=f"{'suspend' if suspending else 'restore'} failed on node {node}: "
            f"{error}; not tried again until the spec changes",
            observed_generation=generation,
        )
    return Condition(
        type=ConditionType.SUSPENDED,
        status="True" if suspending else "False",
        reason=SuspendedReason.SUSPENDED if suspending else SuspendedReason.RESTORED,
        message=f"filesystem committed on node {node}"
        + (f", {pushed}" if pushed else "")
        + ", container removed"
        if suspending
        else f"running again on node {node} from its committed filesystem",
        observed_generation=generation,
    )


def waiting_condition(node: str, generation: int | None, why: str) -> Condition:
    """The condition of a sandbox asked to run again whose node has no room for it
    yet (``why``, the capacity's words): still suspended, and saying why."""
    return Condition(
        type=ConditionType.SUSPENDED,
        status="True",
        reason=SuspendedReason.SUSPENDED,
        message=f"waiting for room to run again on node {node}: {why}",
        observed_generation=generation,
    )


def restore_pull(state: Mapping[str, Any], node: str, local: bool) -> str | None:
    """The pushed reference a restore on ``node`` pulls before it starts, None: it
    starts from the committed image in the node's store. ``state`` is
    ``status.suspendedState`` (empty: never pushed, the local image is all there
    is); ``local``: the committed image is in this node's store now. Pulled when
    another node pushed it (a local copy would be an older commit), and when this
    node pushed it but its copy is gone (collected while the sandbox was away on
    another node): the record names where it was committed, not what is here."""
    reference = str(state.get("image") or "")
    if not reference:
        return None
    if state.get("node") == node and local:
        return None
    return reference


RESTORE_PULL_FIRST_RETRY = timedelta(seconds=5)
RESTORE_PULL_LONGEST_RETRY = timedelta(minutes=5)


@dataclass(frozen=True)
class PullRetry:
    """A restore whose pull of pushed state failed: how often, and when to try again."""

    failures: int
    not_before: datetime


def next_pull_retry(last: PullRetry | None, now: datetime) -> PullRetry:
    """After another failed pull of pushed state: doubling from 5 s to at most 5 min,
    as the kubelet backs off an image pull. A registry that is down or a network
    that is cut comes back without the spec changing; one that lost the state
    keeps failing, each try named on the condition."""
    failures = (last.failures if last else 0) + 1
    delay = capped_doubling(failures, RESTORE_PULL_FIRST_RETRY, RESTORE_PULL_LONGEST_RETRY)
    return PullRetry(failures, now + delay)


def pull_retry_due(retry: PullRetry | None, now: datetime) -> bool:
    return retry is None or now >= retry.not_before


def pull_backoff_condition(
    node: str, generation: int | None, error: str, retry: PullRetry, now: datetime
) -> Condition:
    """Still suspended: the pull of its state failed on ``node``, and when it is tried again."""
    seconds = max(0.0, (retry.not_before - now).total_seconds())
    return Condition(
        type=ConditionType.SUSPENDED,
        status="True",
        reason=SuspendedReason.RESTORE_PULL_BACK_OFF,
        message=f"restore on node {node}: {error}; tried again in {seconds:g}s "
        f"(failure {retry.failures})",
        observed_generation=generation,
    )


def says(obj: Mapping[str, Any], condition: Condition) -> bool:
    """Whether ``obj``'s Suspended condition already reads as ``condition``."""
    current = _condition(obj)
    return current is not None and (
        current.get("status"),
        current.get("reason"),
        current.get("message"),
    ) == (condition.status, condition.reason, condition.message)


__all__ = [
    "RESTORE_PULL_FIRST_RETRY",
    "RESTORE_PULL_LONGEST_RETRY",
    "SUSPENDED_IMAGE_LABEL",
    "SUSPENDED_IMAGE_PREFIX",
    "PullRetry",
    "SuspendStep",
    "decide_suspension",
    "held_mode",
    "idle_suspended",
    "image_uid",
    "is_suspended_image",
    "live_uids",
    "next_pull_retry",
    "orphaned_images",
    "pull_backoff_condition",
    "pull_retry_due",
    "recorded_suspended",
    "restore_pull",
    "says",
    "suspend_failed",
    "suspended_condition",
    "suspended_image_name",
    "suspension_outcome",
    "waiting_condition",
]
