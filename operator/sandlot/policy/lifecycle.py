"""A sandbox's lifecycle on its node, as one table: the steps between its modes, who
takes each, what it records before and after acting, and what the next pass does
when a crash or a lost write leaves a step half done.

Several loops act on one sandbox: the sync (starts, modes, suspends, restores,
drains), the idle loop (freezes), the snapshot loop (commits), the streams
(thaws), the reaper (ends). They meet in two places, and only there:

- **The work slot.** Every step that changes a task or a container runs while it
  holds the sandbox's one work slot (``agent.workpools.SandboxPools``: a queued
  job, or ``holding`` for a loop that acts in place), so no two steps of one
  sandbox interleave: the idle loop never freezes a task a drain is stopping or a
  commit is reading. A slot is the in-memory intent: "this step is under way".
- **The records.** What outlives the agent is the Sandbox's status (the
  ``Paused`` and ``Suspended`` conditions, ``suspendedState``), written by the
  step before it lets go of the slot. A pass that finds the runtime in a state no
  record explains and no slot holds finishes or undoes the step by the rule in
  ``if_lost`` (``STEPS``): a frozen task nobody records is thawed (``thaw_due``),
  a suspension recorded beside its container is finished, a restore that ran
  unsaid is recorded.

The rules are safe in one direction on purpose: where a record is lost, the
sandbox ends up running (its spec asks for it), never frozen or ended.

The loops that take no step of their own (the log pass, the readiness prober)
and the reaper's choice of what to end ask one question of the Sandbox's body,
``held_here``: what this node holds of it (``Held``). A suspended sandbox has no
container on purpose; none of them reads that as ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode, SandboxPhase
from sandlot.policy.operatingmode import FROZEN, TaskState, recorded_paused, wanted_mode
from sandlot.policy.suspension import recorded_suspended


class Step(StrEnum):
    START = "start"
    FREEZE = "freeze"
    """``spec.operatingMode: Paused``."""
    IDLE_FREEZE = "idle-freeze"
    THAW = "thaw"
    """Back to running: the spec asks for Running, or a stream thaws it for use."""
    COMMIT = "commit"
    """Suspend: freeze, commit the writable layer to an image, record, remove."""
    PUSH = "push"
    RESTORE = "restore"
    SNAPSHOT = "snapshot"
    STOP = "stop"
    """A graceful stop (deleted, drained, its lifetime over)."""
    END = "end"
    """The reaper or the sync ends it with its exit, or lost."""


@dataclass(frozen=True)
class StepRule:
    step: Step
    loop: str
    """The agent loop that takes the step."""
    before: str
    """What holds or records the step before it acts."""
    after: str
    """What it records once it acted, before it lets go of the slot."""
    if_lost: str
    """What the next pass does when the agent dies mid-step or the record is lost."""


SLOT = "the sandbox's work slot"

STEPS: tuple[StepRule, ...] = (
    StepRule(
        Step.START,
        "sync",
        f"{SLOT}; the container labelled with the sandbox's key",
        "phase Running, status.containerId",
        "a container beside an unstarted phase is torn down after a fresh read",
    ),
    StepRule(
        Step.FREEZE,
        "sync (the watch event at once)",
        SLOT,
        "Paused True (Paused)",
        "spec Paused, task frozen, no record: the record is written (RECORD)",
    ),
    StepRule(
        Step.IDLE_FREEZE,
        "idle",
        f"{SLOT}, taken in place; skipped while another step holds it",
        "Paused True (Idle)",
        "spec Running, task frozen, no record: thawed (thaw_due)",
    ),
    StepRule(
        Step.THAW,
        "sync; streams for use",
        f"{SLOT} (the sync); the idle lock (streams)",
        "Paused False (Resumed)",
        "spec Running, task running, record says frozen: the record is corrected",
    ),
    StepRule(
        Step.COMMIT,
        "sync",
        f"{SLOT}; the task frozen for the diff",
        "Suspended True, then the container removed",
        "record beside its container: removed (REMOVE); no record: thawed, tried again",
    ),
    StepRule(
        Step.PUSH,
        "sync, after the commit",
        "the committed image on the node",
        "status.suspendedState (repository, digest)",
        "no suspendedState: the state stays on its node and is pushed again",
    ),
    StepRule(
        Step.RESTORE,
        "sync",
        f"{SLOT}; the state pulled when the node lacks it",
        "Suspended False (Restored)",
        "a container beside a Suspended record: adopted if its task runs (thawed if "
        "the commit froze it), else removed and restored from the image (left_behind)",
    ),
    StepRule(
        Step.SNAPSHOT,
        "snapshots",
        f"{SLOT}; the snapshot Taking",
        "the snapshot Ready with its image and digest; the task thawed",
        "spec Running, task frozen, no record: thawed (thaw_due); Taking: taken again",
    ),
    StepRule(
        Step.STOP,
        "sync (drain, delete, lifetime)",
        f"{SLOT}; a drain's stop confirmed on a fresh read",
        "phase Stopped with its reason",
        "a container beside a terminal phase is torn down (cleanup, fence)",
    ),
    StepRule(
        Step.END,
        "reaper; sync",
        f"{SLOT}; the exit read from the runtime; the Sandbox read: a suspended one is left",
        "phase Stopped/Failed with the exit code, or ContainerLost",
        "never for a suspended sandbox: its container is gone on purpose",
    ),
)


@dataclass(frozen=True)
class Invariant:
    name: str
    text: str


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("thawed", "a sandbox whose spec says Running is not left frozen past one sync pass"),
    Invariant(
        "referenced",
        "nothing still referenced (a suspended layer, a snapshot, a pushed manifest "
        "under any tag sharing its digest) is deleted, locally or in a registry",
    ),
    Invariant(
        "acknowledged",
        "a file write acknowledged to a user is in whatever the sandbox resumes from",
    ),
    Invariant("kept-suspended", "the reaper never ends a suspended sandbox"),
    Invariant("one-node", "at most one node runs a sandbox"),
    Invariant("logs", "a sandbox's logs stay while it exists"),
    Invariant("slots", "no stream slot outlives its connection"),
    Invariant("one-clock", "a decision never compares one machine's clock with another's"),
)


def thaw_due(
    mode: OperatingMode,
    task: TaskState | None,
    *,
    recorded_paused: bool,
    idle_paused: bool,
    suspended: bool,
    busy: bool,
) -> bool:
    """Whether a frozen task is a step's lost record, to be thawed: the spec asks
    for Running, the task is frozen, no record explains it (neither a pause the
    condition records, which the mode logic resumes, nor an idle pause, nor a
    suspension, whose own rows finish it), and no step holds the slot (a commit,
    snapshot or idle freeze under way freezes on purpose). ``task``: None when the
    pass did not read it."""
    if mode is not OperatingMode.RUNNING or busy or task not in FROZEN:
        return False
    return not (recorded_paused or idle_paused or suspended)


class Held(StrEnum):
    """What a node holds of a sandbox, by its record."""

    NOTHING = "nothing"
    """No Sandbox, another node's, or ended: nothing of it stays here."""
    STARTING = "starting"
    """Bound here, not Running yet (Pending or Scheduled): its start may be under way."""
    RUNNING = "running"
    """Its task runs here."""
    FROZEN = "frozen"
    """Its task is frozen on purpose, or about to be: the Paused condition is True,
    or the spec asks for Paused or Suspended."""
    SUSPENDED = "suspended"
    """The Suspended condition is True: its files are committed and its container
    removed on purpose (a container still there is the commit's leftover, the
    sync's REMOVE step's to remove)."""


def held(phase: SandboxPhase | None, mode: OperatingMode, *, paused: bool, suspended: bool) -> Held:
    """``Held`` from plain values: ``phase`` None when there is no Sandbox (or it is
    another node's); ``paused``/``suspended``: the Paused/Suspended condition is True."""
    if phase is None or phase in TERMINAL_PHASES:
        return Held.NOTHING
    if phase is not SandboxPhase.RUNNING:
        return Held.STARTING
    if suspended:
        return Held.SUSPENDED
    if paused or mode is not OperatingMode.RUNNING:
        return Held.FROZEN
    return Held.RUNNING


def held_of(obj: Mapping[str, Any]) -> Held:
    """``Held`` of a Sandbox body bound to the asking node (its own watch's)."""
    raw = (obj.get("status") or {}).get("phase") or SandboxPhase.PENDING
    try:
        phase: SandboxPhase | None = SandboxPhase(raw)
    except ValueError:
        phase = None
    return held(
        phase, wanted_mode(obj), paused=recorded_paused(obj), suspended=recorded_suspended(obj)
    )


def held_here(obj: Mapping[str, Any] | None, node: str) -> Held:
    """What ``node`` holds of the Sandbox ``obj`` (None: gone)."""
    if obj is None or (obj.get("spec") or {}).get("nodeName") != node:
        return Held.NOTHING
    return held_of(obj)


def logs_kept(what: Held) -> bool:
    """Whether a sandbox's log files stay (logs): while it exists on this node and
    has not ended, with or without a container."""
    return what is not Held.NOTHING


def probed(what: Held, *, busy: bool) -> bool:
    """Whether the readiness prober probes the sandbox now: only a task that runs,
    with no step holding the work slot (``busy``: a commit or a snapshot freezes it
    for its length). A frozen process would fail every probe and a suspended one
    has none to probe; their Ready verdict stands as last written until they run
    again."""
    return what is Held.RUNNING and not busy


def reaper_leaves(what: Held) -> bool:
    """Whether the reaper leaves a stopped task's container and its Sandbox alone
    (kept-suspended): a suspended sandbox is not ended and its leftover container is
    the sync's REMOVE step's. A suspension still under way holds the work slot, so
    the reaper cannot take it then."""
    return what is Held.SUSPENDED


class LeftBehind(StrEnum):
    ADOPT = "adopt"
    """Its task runs: record it restored."""
    THAW = "thaw"
    """Its task is frozen (the commit's freeze): thaw it, then record it restored."""
    REMOVE = "remove"
    """Its task is gone or never ran: finish the removal; the next pass restores."""
    WAIT = "wait"
    """Its task's state is unknown (a silent shim): look again on the next pass."""


def left_behind(task: TaskState | None) -> LeftBehind:
    """What a restore does with a container it finds beside a Suspended record while
    the spec asks for it to run (``task``: its task's state, None when it has none).
    Either a restore ran and its record was lost (its task runs), or a suspension
    recorded its commit and died before the container was gone (its task frozen by
    the commit, or killed by the removal under way). A container whose process is
    gone cannot serve: adopting it would leave a Running sandbox the reaper ends.
    Its files are in the committed image either way."""
    if task is TaskState.RUNNING:
        return LeftBehind.ADOPT
    if task in FROZEN:
        return LeftBehind.THAW
    if task is TaskState.UNKNOWN:
        return LeftBehind.WAIT
    return LeftBehind.REMOVE


def steps_table() -> str:
    """``STEPS`` as the Markdown table docs/lifecycle.md shows."""
    rows = [
        "| step | taken by | before it acts | recorded after | when its record is lost |",
        "| --- | --- | --- | --- | --- |",
    ]
    rows += [f"| `{r.step}` | {r.loop} | {r.before} | {r.after} | {r.if_lost} |" for r in STEPS]
    return "\n".join(rows)


def invariants_list() -> str:
    """``INVARIANTS`` as the Markdown list docs/lifecycle.md shows."""
    return "\n".join(f"- **{i.name}**: {i.text}" for i in INVARIANTS)


__all__ = [
    "INVARIANTS",
    "STEPS",
    "Held",
    "Invariant",
    "LeftBehind",
    "Step",
    "StepRule",
    "held",
    "held_here",
    "held_of",
    "invariants_list",
    "left_behind",
    "logs_kept",
    "probed",
    "reaper_leaves",
    "steps_table",
    "thaw_due",
]
