"""SandboxSnapshots and the sandboxes forked from them: the decisions, pure.

Who does what:

- the operator binds a snapshot to its sandbox's node (``spec.nodeName``) or fails
  it when there is none to take, adds the ``sandlot.dev/snapshot-in-use`` finalizer
  at once, and lets a deletion finish only when no live Sandbox and no pool
  template names it (``decide_snapshot``);
- the agent of that node takes it (``take_step``) into ``snapshot_image_name``;
- the scheduler places a forked sandbox on the snapshot's node once it is Ready
  (``fork_placement``); that node's agent starts it from ``status.imageRef``;
- the node's image collector never takes a snapshot's image while its object
  lives on the node, and removes it at its next pass once the object is gone
  (``orphaned_snapshot_images``).

``status.imageRef`` is the one place a fork reads where the snapshot is kept: a
node's content store today; a registry reference when snapshots are pushed, with
no change to the forks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sandlot.api.keys import SNAPSHOT_FINALIZER
from sandlot.api.reasons import SnapshotReason
from sandlot.api.sandbox import ACTIVE_PHASES, TERMINAL_PHASES
from sandlot.api.snapshot import TERMINAL_SNAPSHOT_PHASES, SnapshotPhase

SNAPSHOT_IMAGE_PREFIX = "sandlot.local/snapshots/"
SNAPSHOT_IMAGE_LABEL = "sandlot.dev/snapshot"
"""On a snapshot's image: the SandboxSnapshot's "namespace.name"."""


def snapshot_image_name(uid: str) -> str:
    """The image a snapshot is committed to on its node."""
    return f"{SNAPSHOT_IMAGE_PREFIX}{uid}:latest"


def is_snapshot_image(name: str) -> bool:
    return name.startswith(SNAPSHOT_IMAGE_PREFIX)


def snapshot_image_uid(name: str) -> str | None:
    if not is_snapshot_image(name):
        return None
    return name[len(SNAPSHOT_IMAGE_PREFIX) :].rsplit(":", 1)[0]


def orphaned_snapshot_images(names: Iterable[str], live: Collection[str] | None) -> list[str]:
    """Snapshot images whose SandboxSnapshot is gone from this node. ``live``: the
    uids of the node's SandboxSnapshots; None (not known yet) orphans nothing."""
    if live is None:
        return []
    return sorted(n for n in names if (u := snapshot_image_uid(n)) is not None and u not in live)


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def snapshot_ref(spec: Mapping[str, Any]) -> str | None:
    """The snapshot a Sandbox (or template) spec forks from; None: not a fork."""
    ref = spec.get("snapshotRef") or {}
    return str(ref["name"]) if ref.get("name") else None


def referrers(
    name: str, sandboxes: Iterable[Mapping[str, Any]], pools: Iterable[Mapping[str, Any]]
) -> list[str]:
    """What keeps snapshot ``name`` (sandboxes and pools of its namespace): the live
    Sandboxes and the pools whose template name it, as ``kind/name``."""
    out = [
        f"Sandbox/{o['metadata']['name']}"
        for o in sandboxes
        if snapshot_ref(_spec(o)) == name and _status(o).get("phase") not in TERMINAL_PHASES
    ]
    out += [
        f"SandboxPool/{o['metadata']['name']}"
        for o in pools
        if snapshot_ref(((_spec(o).get("template") or {}).get("spec")) or {}) == name
    ]
    return sorted(out)


@dataclass(frozen=True)
class SnapshotDecision:
    """What the operator writes on a snapshot (all None/False: nothing)."""

    add_finalizer: bool = False
    remove_finalizer: bool = False
    node: str | None = None
    """Bind ``spec.nodeName`` to this node."""
    fail: str | None = None
    """End it Failed (reason SandboxNotFound) with this message."""


def decide_snapshot(
    snapshot: Mapping[str, Any], sandbox: Mapping[str, Any] | None, keepers: list[str]
) -> SnapshotDecision:
    """The operator's step for ``snapshot`` given its ``sandbox`` (None: not found)
    and what refers to it (``referrers``)."""
    meta = snapshot.get("metadata") or {}
    held = SNAPSHOT_FINALIZER in (meta.get("finalizers") or ())
    if meta.get("deletionTimestamp"):
        return SnapshotDecision(remove_finalizer=held and not keepers)
    add = not held
    phase = _status(snapshot).get("phase") or SnapshotPhase.PENDING
    if _spec(snapshot).get("nodeName") or phase in TERMINAL_SNAPSHOT_PHASES:
        return SnapshotDecision(add_finalizer=add)
    name = _spec(snapshot).get("sandboxName")
    if sandbox is None:
        return SnapshotDecision(add_finalizer=add, fail=f"sandbox {name} does not exist")
    sb_phase = _status(sandbox).get("phase")
    if sb_phase in TERMINAL_PHASES:
        return SnapshotDecision(add_finalizer=add, fail=f"sandbox {name} has ended ({sb_phase})")
    node = _spec(sandbox).get("nodeName")
    if node and sb_phase in ACTIVE_PHASES:
        return SnapshotDecision(add_finalizer=add, node=str(node))
    return SnapshotDecision(add_finalizer=add)  # not placed yet: wait


class TakeStep(StrEnum):
    COMMIT = "commit"
    """Commit the running or paused container's writable layer."""
    COPY = "copy"
    """A suspended sandbox: its committed image, named again as the snapshot's."""
    FAIL = "fail"
    WAIT = "wait"


def take_step(
    snapshot: Mapping[str, Any],
    sandbox: Mapping[str, Any] | None,
    has_container: bool,
    suspended: bool,
) -> TakeStep | None:
    """The agent's step for a snapshot bound to its node; None: nothing (done, or
    being deleted)."""
    if (snapshot.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if _status(snapshot).get("phase") in TERMINAL_SNAPSHOT_PHASES:
        return None
    if sandbox is None or _status(sandbox).get("phase") in TERMINAL_PHASES:
        return TakeStep.FAIL
    if suspended:
        return TakeStep.COPY
    return TakeStep.COMMIT if has_container else TakeStep.WAIT


def snapshot_status(
    phase: SnapshotPhase, reason: SnapshotReason, message: str, **fields: Any
) -> dict[str, Any]:
    """A status patch (wire names in ``fields``)."""
    return {"phase": phase.value, "reason": reason.value, "message": message, **fields}


@dataclass(frozen=True)
class ForkPlacement:
    """Where a forked sandbox may go: ``node`` (Ready snapshot), or wait/fail saying why."""

    node: str | None = None
    wait: str | None = None
    fail: str | None = None
    anywhere: bool = False
    """The snapshot was pushed: any node may pull it (``node`` preferred: it has it)."""


def fork_placement(name: str, snapshot: Mapping[str, Any] | None) -> ForkPlacement:
    """The scheduler's answer for a sandbox forking from ``name``."""
    if snapshot is None:
        return ForkPlacement(wait=f"snapshot {name} does not exist")
    status = _status(snapshot)
    phase = status.get("phase") or SnapshotPhase.PENDING
    if phase == SnapshotPhase.FAILED:
        return ForkPlacement(fail=f"snapshot {name} failed: {status.get('message') or ''}")
    node = _spec(snapshot).get("nodeName")
    if phase != SnapshotPhase.READY or not node or not status.get("imageRef"):
        return ForkPlacement(wait=f"snapshot {name} is {phase}, not Ready")
    return ForkPlacement(node=str(node), anywhere=bool(status.get("pushedImage")))


@dataclass(frozen=True)
class ForkSource:
    """What a fork starts from on a node: ``image`` in its store, pulled first from
    ``pull`` (the snapshot's pushed reference) when the snapshot was taken elsewhere."""

    image: str
    pull: str | None = None


def fork_image(snapshot: Mapping[str, Any] | None, node: str) -> ForkSource | None:
    """The image a forked sandbox starts from on ``node``; None: not (yet) usable here
    (not Ready, or kept on another node and not pushed)."""
    if snapshot is None or _status(snapshot).get("phase") != SnapshotPhase.READY:
        return None
    ref = _status(snapshot).get("imageRef")
    if not ref:
        return None
    if _spec(snapshot).get("nodeName") == node:
        return ForkSource(str(ref))
    pushed = _status(snapshot).get("pushedImage")
    return ForkSource(str(ref), str(pushed)) if pushed else None


__all__ = [
    "SNAPSHOT_IMAGE_LABEL",
    "SNAPSHOT_IMAGE_PREFIX",
    "ForkPlacement",
    "ForkSource",
    "SnapshotDecision",
    "TakeStep",
    "decide_snapshot",
    "fork_image",
    "fork_placement",
    "is_snapshot_image",
    "orphaned_snapshot_images",
    "referrers",
    "snapshot_image_name",
    "snapshot_image_uid",
    "snapshot_ref",
    "snapshot_status",
    "take_step",
]
