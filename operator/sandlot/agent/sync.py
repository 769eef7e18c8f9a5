"""The sync pass: read the views, ask ``policy.agentsync.plan_sync``, submit its actions.

Nothing is decided here: the node's facts (capacity, limits, placement,
RuntimeClasses, disk pressure) go into the plan as data, and its starts come back
already judged (start, fail or hold). The Sandboxes and the node come from their
watches (an idle node costs the API server no request); the containers from containerd,
listed after the Sandboxes: a Sandbox seen Running had its container created
before its status said so, so the listing that follows has it. The keys with work
in flight are taken before either, so work finishing mid-pass (a start that just
wrote Running) is never judged on the stale view of it.

One change does not wait for a pass: a spec's new operating mode. Passes are paced
(``policy.syncpacing``), and a program pausing and resuming sandboxes back to back
would wait out the rate limit each time; ``mode_changed`` plans that one sandbox
alone (``plan_mode_change``: a pause or resume, nothing else) against the last
pass's containers and hands it to its work slot. No pass runs beside it: a change of
a sandbox whose work is running is held for that work's end (a pass would skip the
key), and the end of a pause or resume that recorded what it did wakes none
(``policy.agentsync.pass_wanted``, ``policy.syncpacing.wake_after``).

A restore is planned on the watched view too, and runs only once a fresh read says
the sandbox is still this node's (``restore_fenced``): a move to another node the
watch has not delivered yet never leaves two nodes running it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from sandlot.adapters.runtime import ContainerInfo, Runtime, RuntimeError_
from sandlot.adapters.sandboxwatch import ChangeCallback, WatchCache
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.modes import ModeChanges
from sandlot.agent.sandboxes import SandboxWork
from sandlot.agent.statestore import StateStore
from sandlot.agent.suspend import IdleHooks, Suspensions
from sandlot.agent.uses import SandboxUses
from sandlot.agent.workpools import SandboxPools
from sandlot.api.common import key_of, split_key
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import (
    WRITTEN,
    Action,
    ActionKind,
    SandboxState,
    drain_stop_stands,
    live_count,
    mode_asked,
    pass_wanted,
    phase_counts,
    plan_mode_change,
    plan_sync,
    plan_thaws,
    startable,
    thaw_stands,
)
from sandlot.policy.capacity import Recorded, recorded_limits
from sandlot.policy.startrefusals import StartFacts
from sandlot.policy.statemove import restore_refusal

log = logging.getLogger(__name__)

GRACEFUL = frozenset({ActionKind.STOP_DRAINED, ActionKind.STOP_DELETED})
"""Actions that wait out a grace period: they run outside the bounded pool."""


def unschedulable(node: Mapping[str, Any] | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def sandbox_listener(sync: SandboxSync, wake: threading.Event, uses: SandboxUses) -> ChangeCallback:
    """What a change of one of the node's Sandboxes does, on the watch's thread (or,
    for the agent's own write, the writer's): a new operating mode handed to ``sync``
    at once (``mode_changed``); the sync woken (``pass_wanted``: not for a change of
    mode alone that was handed over, nor a write of the work running for that
    sandbox), or the change held for the end of that work while it runs (``hold``); a
    use waiting for an idle-suspended sandbox told to look again. Built with the sync
    it hands to, the watch starts with it (``WatchCache.start``)."""

    def changed(event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        # A pause or resume need not wait its pass; handed over first, so any pass
        # finds it in flight.
        handed = False
        if event == "MODIFIED" and new and mode_asked(old, new):
            handed = sync.mode_changed(new)
        # Every other change may matter (phase, deletion, containerId). A write the
        # sandbox's own work made is that work's to follow up when it ends, and so is
        # any change arriving while that work runs (a pass now would skip the key).
        own_work = False
        if new is not None and event == WRITTEN:
            own_work = sync.own_write(key_of(new), _version(new))
        if pass_wanted(event, old, new, handed=handed, own_work=own_work) and not (
            new is not None and event == "MODIFIED" and sync.hold(key_of(new), _version(new))
        ):
            wake.set()
        uses.suspends.changed()

    return changed


class SandboxSync:
    """One pass per call of ``sync_once``; the loop that calls it is ``loops``'s."""

    def __init__(
        self,
        node: str,
        sandbox_watch: WatchCache,
        node_watch: WatchCache,
        rt: Runtime,
        pool: SandboxPools,
        work: SandboxWork,
        metrics: AgentMetrics,
        call_timeout: float,
        report_count: Callable[[int], None] = lambda _count: None,
        refusal: Callable[[], str] = lambda: "",
        *,
        uses: SandboxUses | None = None,
        idle: IdleHooks | None = None,
        store: StateStore | None = None,
    ) -> None:
        self.node = node
        self.sandbox_watch = sandbox_watch
        self.node_watch = node_watch
        self.rt = rt
        self.pool = pool
        self.work = work
        self.metrics = metrics
        self.call_timeout = call_timeout
        self.report_count = report_count
        self.refusal = refusal
        """Why the node starts nothing new now ("" when it does): disk pressure."""
        # Where the sync meets the stream server and the idle loop (``agent.uses``):
        # the sandboxes streams use, and those due for an idle suspension or waited
        # for by a use.
        self.in_use: Callable[[], Collection[str]] = frozenset
        self.idle_flags: Callable[[], tuple[frozenset[str], frozenset[str]]] = _no_flags
        thaws = None
        if uses is not None:
            self.in_use, self.idle_flags, thaws = uses.in_use, uses.suspends.flags, uses.thaws
        self.modes = ModeChanges(
            rt, work.status, node, call_timeout, in_use=self.in_use, thaws=thaws
        )
        if store is None:
            store = StateStore.from_settings(work.settings, rt, work.objects)
        self.suspensions = Suspensions(work, store, wake_in=pool.wake_in, idle=idle, streams=uses)
        # The last pass's containers by their Sandbox's key: what a mode change
        # between passes acts on (its work reads the task again before any call).
        self._listed: dict[str, ContainerInfo] = {}
        # Sandboxes whose new mode waits for their running work to end.
        self._mode_waiting: set[str] = set()
        self._mode_lock = threading.Lock()
        pool.tell_ended(self.work_ended)

    def mode_changed(self, obj: Mapping[str, Any]) -> bool:
        """``obj``'s spec changed its operating mode: the pause or resume a pass would
        make, handed to its work slot now instead of after the passes' rate limit
        (``plan_mode_change``); whatever else it needs waits for the next pass. While
        the sandbox has work running, it is handed over when that work ends
        (``work_ended``). Whether it was handed over (submitted, or waiting for that
        work). Runs on the watch's thread: no call to containerd or the API server."""
        key = key_of(obj)
        with self._mode_lock:
            self._mode_waiting.add(key)
        return self._hand_mode(key, obj)

    def own_write(self, key: str, version: str) -> bool:
        """Whether the calling thread runs ``key``'s work, which wrote ``version`` (then
        noted as its own: the work's end wakes no pass for it)."""
        if not self.pool.running_here(key):
            return False
        self.pool.note_own(key, version)
        return True

    def hold(self, key: str, version: str) -> bool:
        """Hold a change of ``key`` (its new ``version``) for the end of the work running
        for it; False when none runs (then a pass looks now)."""
        return bool(version) and self.pool.note_change(key, version)

    def work_ended(self, key: str) -> bool:
        """``key``'s work ended: a mode change that arrived meanwhile is handed over.
        True asks for a pass: that change came, and is not handed over now."""
        with self._mode_lock:
            waiting = key in self._mode_waiting
        if waiting:
            return not self._hand_mode(key, self.sandbox_watch.get(key))
        return False

    def _hand_mode(self, key: str, obj: Mapping[str, Any] | None) -> bool:
        """Submit ``obj``'s pause or resume if it needs one now; whether it was
        submitted or waits. The key stays waiting only while its work runs:
        ``work_ended`` (called after the work lets go of the key) then looks again, so
        a change is never left between the two."""
        handed = False
        if obj is not None:
            state = SandboxState.from_object(obj)
            container = self._container_of(state, obj)
            action = self._mode_action(state, obj, container)
            if action is not None and self._submit(action, obj, container):
                self.metrics.modes_at_once.inc()
                handed = True
            elif self.pool.busy(key):
                return True  # its work ends later and looks again
        with self._mode_lock:
            self._mode_waiting.discard(key)
        return handed

    def _mode_action(
        self, state: SandboxState, obj: Mapping[str, Any], container: ContainerInfo | None
    ) -> Action | None:
        due, waking = self.idle_flags()
        state = replace(state, idle_suspend_due=state.key in due, waking=state.key in waking)
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        in_flight = set(self.pool.in_flight()) | self.work.status.held({state.key: version})
        view = ContainerView(container.id, container.labels) if container else None
        drained = unschedulable(self.node_watch.get(self.node))
        return plan_mode_change(
            state, view, drained=drained, in_flight=in_flight, in_use=self.in_use()
        )

    def _stop_drained(self, key: str, container: ContainerInfo) -> None:
        """Stop ``key``'s sandbox for the drain once a fresh read agrees
        (``drain_stop_stands``); otherwise the watch is behind, and the pass its
        event wakes does what the Sandbox asks (a suspend, to be moved)."""
        current = self.work.read_again(key, container)
        if current is None:
            return
        view = ContainerView(container.id, container.labels)
        if drain_stop_stands(SandboxState.from_object(current), view):
            self.work.stop_sandbox(current, container, SandboxReason.DRAINED)
        else:
            log.info("sandbox %s: not stopped for the drain: a fresh read asks otherwise", key)

    def _thaw(self, key: str, container: ContainerInfo) -> None:
        """Thaw ``key``'s frozen task that nothing records (a step whose record was
        lost: ``policy.lifecycle``) once a fresh read of the Sandbox and of the task
        agree (``thaw_stands``): the watch may not have brought a pause just recorded."""
        current = self.work.read_again(key, container)
        if current is None:
            return
        try:
            task = self.rt.get_task(container.id, timeout=self.call_timeout)
        except RuntimeError_ as exc:
            log.warning("sandbox %s: cannot read its task before thawing it: %s", key, exc)
            return
        if not thaw_stands(SandboxState.from_object(current), task.state if task else None):
            return
        log.warning("sandbox %s: frozen with nothing recording why: thawing it", key)
        self.metrics.unrecorded_thaws.inc()
        self.modes.apply(current, container)

    def _container_of(self, state: SandboxState, obj: Mapping[str, Any]) -> ContainerInfo | None:
        """The last listing's container of ``state``'s sandbox, or the one its status
        records (this agent's start wrote it) when it started after that listing."""
        container = self._listed.get(state.key)
        if container is None and state.container_id:
            labels = {SANDBOX_LABEL: state.key}
            container = ContainerInfo(state.container_id, str(obj["spec"].get("image")), labels)
        return container

    def sync_once(self) -> None:
        if not (self.sandbox_watch.synced.is_set() and self.node_watch.synced.is_set()):
            return  # no listing yet: an empty map is not "no sandboxes" (their LIST wakes us)
        in_flight = set(self.pool.in_flight())
        bodies: dict[str, tuple[SandboxState, Mapping[str, Any]]] = {}
        for obj in self.sandbox_watch.items():
            state = SandboxState.from_object(obj)
            bodies[state.key] = (state, obj)
        # Sandboxes whose last status write failed wait out their back-off.
        versions = {
            k: str(o["metadata"].get("resourceVersion") or "") for k, (_, o) in bodies.items()
        }
        in_flight |= self.work.status.held(versions)
        due, waking = self.idle_flags()
        if due or waking:
            for key, (state, held) in list(bodies.items()):
                flagged = replace(state, idle_suspend_due=key in due, waking=key in waking)
                bodies[key] = (flagged, held)
        drained = unschedulable(self.node_watch.get(self.node))
        containers = self.rt.list_containers(timeout=self.call_timeout)
        by_id = {c.id: c for c in containers}
        states = [state for state, _ in bodies.values()]
        for phase, count in phase_counts(states).items():
            self.metrics.sandboxes.labels(phase.value).set(count)
        self.report_count(live_count(states))
        views = [ContainerView(c.id, c.labels) for c in containers]  # tasks: see _thaw_lost
        self._listed = {c.labels[SANDBOX_LABEL]: c for c in containers if SANDBOX_LABEL in c.labels}
        starting = startable(states, views, drained=drained, in_flight=in_flight)
        live = {
            k: o.get("spec") or {}
            for k, (st, o) in bodies.items()
            if st.phase not in TERMINAL_PHASES
        }
        survey = self.work.runtime_classes.survey(live, starting)
        facts = StartFacts(
            node=self.node,
            capacity=self.work.facts.capacity,
            bodies={k: o for k, (_, o) in bodies.items()},
            node_body=self.node_watch.get(self.node),
            default_memory=self.work.settings.default_memory_limit,
            default_cpu=self.work.settings.default_cpu_limit,
            default_storage=self.work.settings.default_ephemeral_storage_limit,
            recorded=recorded(containers),
            namespace_defaults=self.work.rules.defaults_of(bodies[k][1] for k in starting),
            classes=survey.classes,
            class_refused=survey.refused,
            class_unreadable=survey.unreadable,
            hold=self.refusal(),
        )
        in_use = self.in_use()
        actions = plan_sync(
            states, views, drained=drained, in_flight=in_flight, facts=facts, in_use=in_use
        )
        for action in actions:
            body = bodies[action.key][1] if action.key in bodies else None
            container = by_id[action.container_id] if action.container_id else None
            self._submit(action, body, container)
        planned = in_flight | {a.key for a in actions}
        self._thaw_lost(states, containers, drained, planned, bodies, in_use)
        self.metrics.sync_passes.inc()

    def _thaw_lost(
        self,
        states: list[SandboxState],
        containers: list[ContainerInfo],
        drained: bool,
        planned: set[str],
        bodies: Mapping[str, tuple[SandboxState, Mapping[str, Any]]],
        in_use: Collection[str],
    ) -> None:
        """The lifecycle's lost records: a task frozen with nothing recording why is
        thawed (``plan_thaws``). Only they need the node's task states, and listing
        them asks every task's shim (100-odd shims: about 140 ms on a 2-core node),
        so they are listed after the pass handed its other actions over, not before:
        a start never waits for them. ``planned``: keys that got an action this pass
        or have work running."""
        try:
            tasks = {t.container_id: t.state for t in self.rt.list_tasks(timeout=self.call_timeout)}
        except RuntimeError_ as exc:
            log.warning("the node's tasks not listed this pass: %s", exc)
            return
        views = [ContainerView(c.id, c.labels, tasks.get(c.id)) for c in containers]
        by_id = {c.id: c for c in containers}
        thaws = plan_thaws(states, views, drained=drained, in_flight=planned, in_use=in_use)
        for action in thaws:
            container = by_id[action.container_id] if action.container_id else None
            self._submit(action, bodies[action.key][1], container)

    def _submit(
        self, action: Action, sb: Mapping[str, Any] | None, container: ContainerInfo | None
    ) -> bool:
        """Hand ``action`` to its sandbox's work slot; whether it was taken (not when
        that sandbox has work running)."""
        work = self._work_for(action, sb, container)
        if work is None:  # the plan names only what it was given: a bug, not a state
            log.error("sandbox %s: action %s lacks its Sandbox or container", action.key, action)
            return False
        submitted = self.pool.submit(action.key, work, graceful=action.kind in GRACEFUL)
        if submitted and action.kind is ActionKind.FENCE:
            log.warning(
                "sandbox %s was marked Dead: tearing down container %s",
                action.key,
                action.container_id,
            )
            self.metrics.fenced.inc()
        return submitted

    def _work_for(
        self, action: Action, sb: Mapping[str, Any] | None, container: ContainerInfo | None
    ) -> Callable[[], object] | None:
        work, kind, key = self.work, action.kind, action.key
        if kind is ActionKind.START and sb is not None:
            return partial(work.start_sandbox, sb)
        if kind is ActionKind.FAIL and sb is not None:
            return partial(work.fail, sb, action.reason, action.message)
        if kind is ActionKind.HOLD and sb is not None:
            return partial(work.hold, sb, action.reason, action.message)
        if kind is ActionKind.REFUSE_DRAINED and sb is not None:
            return partial(work.refuse_drained, sb, SandboxReason.DRAINED)
        if kind is ActionKind.END_LOST:
            return partial(work.end_lost, key)
        if kind is ActionKind.END_DRAINED and sb is not None:
            return partial(work.end_drained, sb, SandboxReason.DRAINED)
        if kind is ActionKind.RESTORE and sb is not None:
            find = self.work.objects.find_sandbox
            return partial(restore_fenced, find, self.node, self.suspensions.restore, sb, container)
        if kind is ActionKind.WAIT_RESTORE and sb is not None:
            return partial(self.suspensions.wait_for_room, sb, action.message)
        if kind is ActionKind.PUSH and sb is not None:
            return partial(self.suspensions.push_owed, sb)
        if container is None:
            return None
        if kind is ActionKind.TEARDOWN_UNSTARTED:
            return partial(work.teardown_unstarted, key, container)
        if kind is ActionKind.APPLY_MODE and sb is not None:
            return partial(self.modes.settle, sb, container)
        if kind is ActionKind.SUSPEND and sb is not None:
            return partial(self.suspensions.suspend, sb, container)
        if kind is ActionKind.IDLE_SUSPEND and sb is not None:
            return partial(self.suspensions.suspend_idle, sb, container)
        if kind is ActionKind.THAW:
            return partial(self._thaw, key, container)
        if kind is ActionKind.STOP_DRAINED and sb is not None:
            return partial(self._stop_drained, key, container)
        if kind is ActionKind.STOP_DELETED:
            return partial(work.stop_deleted, key, container)
        if kind is ActionKind.CLEANUP and sb is not None:
            return partial(work.stop_ended, sb, container)
        if kind in (ActionKind.FENCE, ActionKind.CLEANUP):  # Dead: fenced at once
            return partial(work.teardown, container)
        return None


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _no_flags() -> tuple[frozenset[str], frozenset[str]]:
    return frozenset(), frozenset()


def restore_fenced(
    find: Callable[[str, str], Mapping[str, Any] | None],
    node: str,
    restore: Callable[[Mapping[str, Any], ContainerInfo | None], object],
    sb: Mapping[str, Any],
    container: ContainerInfo | None,
) -> object:
    """``restore`` the sandbox the watch showed as ``sb`` only once a fresh read
    (``find``) says it is still this node's (``policy.statemove.restore_refusal``).

    The watched view lags: a pushed sandbox the scheduler moved to another node may
    still look like this node's, and both nodes would run it. An unreadable Sandbox
    is not restored either (an agent cut off from the API server starts nothing it
    cannot confirm); the next pass asks again.
    """
    key = key_of(sb)
    try:
        current = find(*split_key(key))
    except Exception as exc:
        log.warning("sandbox %s: cannot read it again before its restore: %s", key, exc)
        return None
    why = restore_refusal(current, str(sb["metadata"]["uid"]), node)
    if why is not None or current is None:
        log.info("sandbox %s: not restored on node %s: %s", key, node, why)
        return None
    return restore(current, container)


def recorded(containers: Collection[ContainerInfo]) -> dict[str, Recorded]:
    """Each sandbox's limits as its container's labels record them (the limits its
    start decided), by key."""
    return {
        c.labels[SANDBOX_LABEL]: recorded_limits(c.labels)
        for c in containers
        if c.labels.get(SANDBOX_LABEL)
    }


__all__ = ["SandboxSync", "recorded", "restore_fenced", "unschedulable"]
