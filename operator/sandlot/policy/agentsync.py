"""What the agent's sync pass does about each sandbox and container: a pure decision.

A pass compares this node's Sandboxes (their phases, as last seen) with the
containers containerd has, and turns every difference into one action:

==========================  ==========================  =======================
Sandbox                     container                   action
==========================  ==========================  =======================
Pending/Scheduled           none, node not drained      start (or fail/hold, below)
Pending/Scheduled           none, node drained          refuse (Stopped/Drained)
Pending/Scheduled           present                     teardown-unstarted
Running                     present                     none (adopted)
Running, mode to apply      present                     apply-mode (pause/resume)
Running, idle-paused        present                     none (use resumes it)
Running, idle, to suspend   present                     idle-suspend (as suspend,
                                                        the condition says Idle)
Running, idle-suspended     none                        none, until a use wakes it
                                                        (then restore)
Running, to pause, in use   present                     none (until its streams end)
Running, spec Running       present, task frozen, no    thaw (a lost record:
                            record, no step under way   ``policy.lifecycle``)
Running, to suspend         present                     suspend (commit, remove;
                                                        on a drained node too)
Running, suspended          none, node not drained,     restore (start from the
                            mode not Suspended          committed image)
Running                     present, node drained       stop (Stopped/Drained),
                                                        once a fresh read agrees
Running, suspended, pushed  none, node drained          none (the scheduler moves it)
Running, suspended, push    none, held suspended or     push (again, once its back-off
owed                        node drained                is over; ``policy.statepush``)
Running, suspended          none, node drained          end-drained (Stopped/Drained)
Running, had a container    none, not suspended         end-lost (ContainerLost)
Dead                        present                     fence (tear down, counted)
Stopped/Failed              present                     cleanup (tear down)
no Sandbox                  labelled with its key       stop-deleted
==========================  ==========================  =======================

A key with work in flight gets nothing: one sandbox never has two operations at
once, and the views of it are stale (a start that wrote Running a moment ago is
still seen Scheduled beside its new container, and must not be torn down for it).
The pass after that work ends looks again. A container without a sandbox label
is none of the sync's business: the start-up sweep removed those. "Mode to
apply" is ``policy.operatingmode.mode_pending``: the spec's operatingMode differs
from what the Paused condition records; a drained node stops the sandbox instead.
Suspending and restoring are ``policy.suspension.decide_suspension``'s; a
suspended sandbox counts nothing in the node's capacity, and its restore waits
until the node has room for it (judged before the starts: it was here first).

Given the node's facts (``policy.startrefusals.StartFacts``: capacity, limits,
placement, RuntimeClasses, disk pressure), a start the node refuses becomes a
``fail`` or ``hold`` with its reason and message, or nothing this pass.

``teardown-unstarted`` re-reads the Sandbox before acting (the watched view lags
the agent's own writes), and so does a drain's stop (``drain_stop_stands``: the
drain's request to suspend may trail its cordon); those reads are I/O and stay in
the agent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sandlot.api.common import key_of
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode, SandboxPhase
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.capacity import over_capacity
from sandlot.policy.lifecycle import Held, held, thaw_due
from sandlot.policy.operatingmode import (
    TaskState,
    failed_at_generation,
    idle_paused,
    mode_pending,
    recorded_paused,
    wanted_mode,
)
from sandlot.policy.startrefusals import Refusal, StartFacts, refused_starts, usage
from sandlot.policy.statepush import push_pending
from sandlot.policy.suspension import (
    SuspendStep,
    decide_suspension,
    held_mode,
    idle_suspended,
    recorded_suspended,
    suspend_failed,
)

UNSTARTED_PHASES: frozenset[SandboxPhase] = frozenset(
    {SandboxPhase.PENDING, SandboxPhase.SCHEDULED}
)


class ActionKind(StrEnum):
    START = "start"
    FAIL = "fail"
    """A start the node refuses: the sandbox ends Failed (``reason``, ``message``)."""
    HOLD = "hold"
    """A start the node defers: the sandbox waits (``reason``, ``message``)."""
    REFUSE_DRAINED = "refuse-drained"
    TEARDOWN_UNSTARTED = "teardown-unstarted"
    STOP_DRAINED = "stop-drained"
    END_DRAINED = "end-drained"
    """A suspended sandbox (no container) on a drained node: ended Stopped/Drained."""
    APPLY_MODE = "apply-mode"
    THAW = "thaw"
    """A frozen task no record explains (``policy.lifecycle.thaw_due``): thawed once
    a fresh read agrees."""
    SUSPEND = "suspend"
    IDLE_SUSPEND = "idle-suspend"
    """Suspend a sandbox its agent found idle (``spec.idleAction: Suspend``)."""
    RESTORE = "restore"
    PUSH = "push"
    """Push a suspended sandbox's state whose earlier push failed for a reason that
    may pass (its condition says ``PushPending``): kept, even on a drained node."""
    WAIT_RESTORE = "wait-restore"
    """A restore the node has no room for yet: its Suspended condition says why
    (``message``); it stays suspended until a pass finds room."""
    END_LOST = "end-lost"
    FENCE = "fence"
    CLEANUP = "cleanup"
    STOP_DELETED = "stop-deleted"


@dataclass(frozen=True)
class SandboxState:
    """What the sync reads of a Sandbox bound to this node."""

    key: str
    """"namespace/name"."""
    phase: SandboxPhase
    container_id: str | None = None
    """``status.containerId``: set once a start reached Running."""
    mode: OperatingMode = OperatingMode.RUNNING
    """``spec.operatingMode``."""
    paused: bool = False
    """The Paused condition is True."""
    mode_failed: bool = False
    """The runtime refused the last pause or resume of this spec's generation."""
    idle_paused: bool = False
    """Its agent froze it for being idle (the spec still asks for Running)."""
    suspended: bool = False
    """The Suspended condition is True: its filesystem is committed."""
    suspend_failed: bool = False
    """The runtime refused the last suspend or restore of this spec's generation."""
    pushed: bool = False
    """``status.suspendedState`` is set: its committed state is in a registry."""
    push_pending: bool = False
    """Its push failed for a reason that may pass and is owed (``PushPending``)."""
    idle_suspended: bool = False
    """Its agent suspended it for being idle (the spec still asks for Running)."""
    idle_suspend_due: bool = False
    """The agent's idle loop found it idle past its timeout (``idleAction: Suspend``)."""
    waking: bool = False
    """A use (exec, files, port-forward, claim) waits for it to run again."""

    @property
    def held(self) -> Held:
        """What this node holds of it (``policy.lifecycle.held``)."""
        return held(self.phase, self.mode, paused=self.paused, suspended=self.suspended)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> SandboxState:
        status = obj.get("status") or {}
        return cls(
            key=key_of(obj),
            phase=SandboxPhase(status.get("phase") or SandboxPhase.PENDING),
            container_id=status.get("containerId") or None,
            mode=wanted_mode(obj),
            paused=recorded_paused(obj),
            mode_failed=failed_at_generation(obj),
            idle_paused=idle_paused(obj),
            suspended=recorded_suspended(obj),
            suspend_failed=suspend_failed(obj),
            pushed=bool(status.get("suspendedState")),
            push_pending=push_pending(obj),
            idle_suspended=idle_suspended(obj),
        )


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    key: str
    """The Sandbox's "namespace/name" (also the container's label)."""
    container_id: str | None = None
    """The container acted on; None for start, fail, hold, refuse-drained and end-lost."""
    reason: str = ""
    """fail and hold: the status reason."""
    message: str = ""


def containers_by_key(containers: Iterable[ContainerView]) -> dict[str, ContainerView]:
    """Labelled containers by their Sandbox's key (unlabelled ones are left out)."""
    return {c.labels[SANDBOX_LABEL]: c for c in containers if c.labels.get(SANDBOX_LABEL)}


def _for_sandbox(
    sb: SandboxState, container: ContainerView | None, drained: bool, in_use: bool = False
) -> Action | None:
    cid = container.id if container is not None else None
    if sb.phase in UNSTARTED_PHASES:
        if cid is not None:
            return Action(ActionKind.TEARDOWN_UNSTARTED, sb.key, cid)
        return Action(ActionKind.REFUSE_DRAINED if drained else ActionKind.START, sb.key)
    if sb.phase is SandboxPhase.RUNNING:
        return _for_running(sb, container, drained, in_use)
    if cid is None:
        return None
    if sb.phase is SandboxPhase.DEAD:
        return Action(ActionKind.FENCE, sb.key, cid)
    return Action(ActionKind.CLEANUP, sb.key, cid)


def _for_running(
    sb: SandboxState, container: ContainerView | None, drained: bool, in_use: bool = False
) -> Action | None:
    cid = container.id if container is not None else None
    idle_due = sb.idle_suspend_due and not (sb.waking or in_use or drained)
    if idle_due and sb.mode is OperatingMode.RUNNING and cid and not sb.suspended:
        return Action(ActionKind.IDLE_SUSPEND, sb.key, cid)
    mode = held_mode(sb.mode, sb.idle_suspended, sb.waking)
    step = decide_suspension(mode, sb.suspended, cid is not None, sb.suspend_failed)
    if drained and step in (SuspendStep.COMMIT, SuspendStep.REMOVE):  # kept, not ended
        return Action(ActionKind.SUSPEND, sb.key, cid)
    if drained and cid is not None:
        return Action(ActionKind.STOP_DRAINED, sb.key, cid)
    if drained and sb.suspended and sb.pushed:  # pushed: the scheduler moves it
        return None
    if sb.push_pending and cid is None and (drained or step is SuspendStep.NONE):
        return Action(ActionKind.PUSH, sb.key)  # it may still leave: never ended meanwhile
    if drained and sb.suspended:  # its state stays on this node: it cannot move
        return Action(ActionKind.END_DRAINED, sb.key)
    if step is SuspendStep.NONE:
        return None
    if step in (SuspendStep.COMMIT, SuspendStep.REMOVE):
        return Action(ActionKind.SUSPEND, sb.key, cid)
    if step is not None:  # restore, or record a restore: never onto a drained node
        return None if drained else Action(ActionKind.RESTORE, sb.key, cid)
    if cid is None:
        return Action(ActionKind.END_LOST, sb.key) if sb.container_id else None
    if mode_pending(sb.mode, sb.paused, sb.mode_failed, sb.idle_paused):
        if in_use and sb.mode is OperatingMode.PAUSED:
            return None  # thawed for a stream: frozen again once it ends
        return Action(ActionKind.APPLY_MODE, sb.key, cid)
    if container is not None and frozen_unrecorded(sb, container.task):
        return Action(ActionKind.THAW, sb.key, cid)
    return None


def frozen_unrecorded(sb: SandboxState, task: TaskState | None) -> bool:
    """``sb``'s task is frozen with nothing recording why and no step under way
    (the plan leaves keys with work in flight alone): ``policy.lifecycle.thaw_due``."""
    return thaw_due(
        sb.mode,
        task,
        recorded_paused=sb.paused,
        idle_paused=sb.idle_paused,
        suspended=sb.suspended,
        busy=False,
    )


def thaw_stands(fresh: SandboxState, task: TaskState | None) -> bool:
    """Whether a thaw planned on the watched view stands on a fresh read of the
    Sandbox and a fresh read of its task: a pause recorded a moment ago (an idle
    freeze whose condition the watch has not brought yet) is not undone."""
    return fresh.phase is SandboxPhase.RUNNING and frozen_unrecorded(fresh, task)


def drain_stop_stands(fresh: SandboxState, container: ContainerView) -> bool:
    """Whether a stop planned for the drain (``STOP_DRAINED``, on the watched view)
    still stands on a fresh read of the Sandbox. The node's watch and the
    Sandboxes' are two streams: ``drain --move`` asks a sandbox to suspend and then
    cordons its node, and the cordon may arrive first; a stop then would end the
    work the drain meant to move."""
    action = _for_sandbox(fresh, container, drained=True)
    return action is not None and action.kind is ActionKind.STOP_DRAINED


def plan_sync(
    sandboxes: Sequence[SandboxState],
    containers: Sequence[ContainerView],
    *,
    drained: bool,
    in_flight: Collection[str],
    facts: StartFacts | None = None,
    in_use: Collection[str] = (),
) -> list[Action]:
    """One action per difference, Sandboxes first (in the order given), then the
    containers whose Sandbox is gone. ``drained``: the node is unschedulable.
    ``in_flight``: keys with work running; they get nothing this pass. ``facts``:
    the node's, judging each start (``policy.startrefusals``); without them every
    start stands. ``in_use``: keys with a stream open; a pause the spec asks
    for waits until it ends (the stream server thawed it to serve it)."""
    by_key = containers_by_key(containers)
    actions: list[Action] = []
    for sb in sandboxes:
        if sb.key in in_flight:
            continue
        action = _for_sandbox(sb, by_key.get(sb.key), drained, sb.key in in_use)
        if action is not None:
            actions.append(action)
    seen = {sb.key for sb in sandboxes}
    for key, container in by_key.items():
        if key not in seen and key not in in_flight:
            actions.append(Action(ActionKind.STOP_DELETED, key, container.id))
    return actions if facts is None else _judged(actions, sandboxes, set(by_key), facts)


def mode_asked(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a watch event from ``old`` to ``new`` changed what the spec asks of the
    task (``spec.operatingMode``): the one change an agent acts on between passes."""
    if old is None or new is None:
        return False
    return wanted_mode(old) is not wanted_mode(new)


WRITTEN = "WRITTEN"
"""The event of the agent's own status write (``adapters.sandboxwatch.WatchCache.observe``)."""

METADATA_OF_A_SPEC_WRITE = frozenset({"resourceVersion", "generation", "managedFields"})
"""What a spec write changes in ``metadata`` by itself."""


def _beside_mode(obj: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return (
        {k: v for k, v in meta.items() if k not in METADATA_OF_A_SPEC_WRITE},
        {k: v for k, v in spec.items() if k != "operatingMode"},
        {k: v for k, v in obj.items() if k not in ("metadata", "spec")},
    )


def pass_wanted(
    event: str,
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    *,
    handed: bool = False,
    own_work: bool = False,
) -> bool:
    """Whether a change of one Sandbox calls for a sync pass (``event``: the watch's,
    or ``WRITTEN`` for the agent's own status write, seen as it returns).

    A pass leaves a key with work running alone, and the end of that work wakes a
    pass unless it settled all it was handed (``agent.loops.WorkPool``). So these
    call for none: a change of the asked mode and nothing else once handed over
    (``handed``: submitted to the sandbox's work slot, or waiting for the work running
    there); a status write that work made itself (``own_work``); and one the watch
    brought before the write returned (the same version on both sides: the watch's
    event already asked). Run beside a pause, such a pass would only take the node's
    CPU and containerd from it. Every other change calls for one (status, deletion,
    labels, other spec fields, anyone else's write); while the key's work runs, the
    agent holds it for that work's end instead."""
    if event == WRITTEN:
        return not own_work and _version(old) != _version(new)
    if event != "MODIFIED" or not handed or old is None or new is None:
        return True
    return _beside_mode(old) != _beside_mode(new)


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def plan_mode_change(
    sb: SandboxState,
    container: ContainerView | None,
    *,
    drained: bool,
    in_flight: Collection[str],
    in_use: Collection[str] = (),
) -> Action | None:
    """What a change of ``sb``'s operating mode may do at once, outside the paced
    passes: pause or resume its running task (``APPLY_MODE``) exactly where a pass
    would, nothing else. A start, suspend, restore or teardown waits for the next
    pass, which judges the whole node (capacity, drains, the containers as listed)."""
    planned = plan_sync(
        [sb], [container] if container else [], drained=drained, in_flight=in_flight, in_use=in_use
    )
    return next((a for a in planned if a.kind is ActionKind.APPLY_MODE), None)


def _judged(
    actions: list[Action],
    sandboxes: Sequence[SandboxState],
    with_container: set[str],
    facts: StartFacts,
) -> list[Action]:
    starting = [a.key for a in actions if a.kind is ActionKind.START]
    # A restore takes room as a start does: judged on capacity alone (it was placed
    # here already), before the starts, and waits while the node is full.
    restoring = [a.key for a in actions if a.kind is ActionKind.RESTORE and not a.container_id]
    if not starting and not restoring:
        return actions
    started = [
        sb.key
        for sb in sandboxes
        if sb.phase not in TERMINAL_PHASES
        and (sb.phase not in UNSTARTED_PHASES or sb.key in with_container)
        and not (sb.suspended and sb.key not in with_container)  # holds nothing
    ]
    no_room = over_capacity(
        facts.node,
        [usage(k, facts) for k in started],
        [usage(k, facts) for k in restoring],
        facts.capacity,
    )
    started += [k for k in restoring if k not in no_room]
    refused = refused_starts(starting, started, facts) if starting else {}
    judged = []
    for action in actions:
        if action.kind is ActionKind.RESTORE and action.key in no_room:
            # Stays suspended until the node has room, saying so.
            judged.append(Action(ActionKind.WAIT_RESTORE, action.key, message=no_room[action.key]))
            continue
        why = refused.get(action.key) if action.kind is ActionKind.START else None
        if why is None:
            judged.append(action)
        elif why.how is not Refusal.WAIT:
            kind = ActionKind.FAIL if why.how is Refusal.FAIL else ActionKind.HOLD
            judged.append(Action(kind, action.key, reason=why.reason, message=why.message))
    return judged


def plan_thaws(
    sandboxes: Sequence[SandboxState],
    containers: Sequence[ContainerView],
    *,
    drained: bool,
    in_flight: Collection[str],
    in_use: Collection[str] = (),
) -> list[Action]:
    """The ``THAW`` actions ``plan_sync`` would give ``containers`` with their tasks'
    states: the one action that needs them. The pass plans everything else on the
    containers alone (a task not read is never frozen), hands it over, then lists
    the tasks and asks this for the keys it left alone (``in_flight``), with the
    same ``in_use`` (it decides which rows come before the thaw)."""
    plan = plan_sync(sandboxes, containers, drained=drained, in_flight=in_flight, in_use=in_use)
    return [a for a in plan if a.kind is ActionKind.THAW]


def startable(
    sandboxes: Sequence[SandboxState],
    containers: Sequence[ContainerView],
    *,
    drained: bool,
    in_flight: Collection[str],
) -> list[str]:
    """The keys ``plan_sync`` would start before the node's facts judge them: the
    ones whose facts (their RuntimeClass) the agent reads for this pass."""
    plan = plan_sync(sandboxes, containers, drained=drained, in_flight=in_flight)
    return [a.key for a in plan if a.kind is ActionKind.START]


def phase_counts(sandboxes: Iterable[SandboxState]) -> dict[SandboxPhase, int]:
    """Sandboxes per phase, every phase present (a gauge must fall back to 0)."""
    counts = dict.fromkeys(SandboxPhase, 0)
    for sb in sandboxes:
        counts[sb.phase] += 1
    return counts


def live_count(sandboxes: Iterable[SandboxState]) -> int:
    """The node's non-terminal sandboxes: its SandboxNode's ``status.sandboxes``."""
    return sum(1 for sb in sandboxes if sb.phase not in TERMINAL_PHASES)


__all__ = [
    "UNSTARTED_PHASES",
    "Action",
    "ActionKind",
    "SandboxState",
    "containers_by_key",
    "drain_stop_stands",
    "frozen_unrecorded",
    "live_count",
    "mode_asked",
    "pass_wanted",
    "phase_counts",
    "plan_mode_change",
    "plan_sync",
    "plan_thaws",
    "startable",
    "thaw_stands",
]
