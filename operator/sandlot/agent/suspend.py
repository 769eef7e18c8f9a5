"""Suspending a sandbox and bringing it back on its node: the steps, applied.

``policy.suspension.decide_suspension`` says which step is due; this makes its
runtime calls, each bounded. A suspend freezes the task (a consistent
filesystem), commits its filesystem to the sandbox's image, records the
``Suspended`` condition and only then removes the container: a crash in between
leaves a recorded sandbox whose container the next pass removes, never a sandbox
ended for a container it lost. A restore starts a new container from the image
as a start would (its checks, network and log), then records it. A timeout
writes nothing (the next pass tries again); a refusal is recorded with the
spec's generation.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Protocol

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.runtime import (
    ContainerInfo,
    NotFound,
    RuntimeError_,
    RuntimeTimeout,
    TaskState,
)
from sandlot.adapters.statuswrite import WriteOutcome
from sandlot.agent.sandboxes import SandboxWork, StartFailed
from sandlot.agent.statestore import StateStore
from sandlot.api.common import Condition, key_of
from sandlot.api.reasons import ConditionType, SuspendedReason
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions
from sandlot.policy.idle import effective_mode, idle_suspend_condition
from sandlot.policy.lifecycle import LeftBehind, left_behind
from sandlot.policy.operatingmode import recorded_paused
from sandlot.policy.statepush import owing, push_may_pass, push_pending_note, settled
from sandlot.policy.suspension import (
    SUSPENDED_IMAGE_LABEL,
    PullRetry,
    SuspendStep,
    decide_suspension,
    idle_suspended,
    next_pull_retry,
    pull_backoff_condition,
    pull_retry_due,
    recorded_suspended,
    restore_pull,
    says,
    suspend_failed,
    suspended_condition,
    suspended_image_name,
    waiting_condition,
)

log = logging.getLogger(__name__)


class IdleHooks(Protocol):
    """What suspending for idleness asks of the idle loop (``agent.idle.IdlePauses``)."""

    def begin(self, key: str) -> bool: ...

    def refused(self, key: str) -> None: ...

    def waking(self, key: str) -> bool: ...

    def suspended(self, sb: Mapping[str, Any]) -> None: ...


class StreamGate(Protocol):
    """What a suspension asks of the stream server (``agent.streams.StreamServer``):
    to begin only while no stream uses the sandbox, and to admit none until it ends."""

    def suspending(self, key: str) -> AbstractContextManager[bool]: ...


class _NoStreams:
    def suspending(self, key: str) -> AbstractContextManager[bool]:
        return contextlib.nullcontext(True)


RUNNING_ONLY = frozenset({SandboxPhase.RUNNING})


class Suspensions:
    """Suspends and restores this node's sandboxes through ``work``'s runtime."""

    def __init__(
        self,
        work: SandboxWork,
        store: StateStore | None = None,
        wake_in: Callable[[float], None] = lambda _seconds: None,
        *,
        idle: IdleHooks | None = None,
        streams: StreamGate | None = None,
    ) -> None:
        self.work = work
        # A commit writes the whole writable layer: a pull's budget, not a call's.
        self.commit_timeout = work.settings.image_pull_deadline.total_seconds()
        self.store = store
        self.wake_in = wake_in  # the sync, woken when a pull's back-off ends
        self._pull_retries: dict[str, PullRetry] = {}  # by uid: pulls of pushed state that failed
        self._push_retries: dict[str, PullRetry] = {}  # by uid: pushes owed, backing off
        self.idle = idle  # the idle loop's (None: nothing is suspended for idleness)
        # The streams' slots (``agent.uses``): a suspension begins only with none open.
        self.streams: StreamGate = streams if streams is not None else _NoStreams()

    def _push(
        self, sb: Mapping[str, Any], image: str
    ) -> tuple[dict[str, Any], str | None, PullRetry | None]:
        """The committed ``image`` pushed when a repository is set: the status fields
        that say where, a note for the condition (None: nothing to say), and when a
        push that failed for a reason that may pass is tried again (None: not owed)."""
        if self.store is None:
            return {}, None, None
        uid = sb["metadata"]["uid"]
        try:
            pushed = self.store.push(uid, uid, image)
        except (RegistryError, RuntimeError_, RuntimeTimeout) as exc:
            log.warning("sandbox %s: state not pushed: %s", key_of(sb), exc)
            if isinstance(exc, RegistryError):
                may_pass = push_may_pass(exc.kind)
            else:
                may_pass = isinstance(exc, RuntimeTimeout)
            if not may_pass:
                self._push_retries.pop(uid, None)
                return {}, f"not pushed ({exc}): it stays on this node", None
            now = self.work.status.clock()
            retry = next_pull_retry(self._push_retries.get(uid), now)
            self._push_retries[uid] = retry
            return {}, push_pending_note(str(exc), retry, now), retry
        self._push_retries.pop(uid, None)
        state = {"image": pushed.reference, "digest": pushed.digest, "node": self.work.node}
        return {"suspendedState": state}, f"pushed to {pushed.reference}", None

    def push_owed(self, sb: Mapping[str, Any]) -> None:
        """Push again the state of ``sb``, suspended here with its push owed
        (``PushPending``), once its back-off is over; a restarted agent tries at once."""
        uid, work = sb["metadata"]["uid"], self.work
        if not pull_retry_due(self._push_retries.get(uid), work.status.clock()):
            return  # the sync is woken when it is due
        if self.store is None:
            fields: dict[str, Any] = {}
            note: str | None = "not pushed: this node has no state repository now"
            retry = None
        else:
            fields, note, retry = self._push(sb, suspended_image_name(uid))
        generation = (sb.get("metadata") or {}).get("generation")
        if idle_suspended(sb):
            seconds = (sb.get("spec") or {}).get("idleTimeoutSeconds") or 0
            base = idle_suspend_condition(
                work.node, timedelta(seconds=int(seconds)), generation, note
            )
        else:
            base = suspended_condition(True, work.node, generation, None, note)
        condition = owing(base) if retry is not None else settled(base)
        outcome = self._write(sb, [condition], fields)
        log.info("sandbox %s: push %s, condition %s", key_of(sb), note, outcome)
        if retry is not None:
            self.wake_in((retry.not_before - work.status.clock()).total_seconds())

    def _pull(self, sb: Mapping[str, Any], image: str) -> tuple[str | None, bool]:
        """Pull ``sb``'s pushed state as ``image`` when this node's store lacks that
        commit (``restore_pull``): the refusal (None when the image is here), and
        whether trying again may help."""
        state = (sb.get("status") or {}).get("suspendedState") or {}
        local = bool(state) and state.get("node") == self.work.node and self._have(image)
        reference = restore_pull(state, self.work.node, local)
        if reference is None:
            return None, False
        if self.store is None:
            return f"its state is in {reference}, and this node has no state repository", False
        try:
            self.store.pull(reference, image, str(sb["metadata"]["uid"]))
        except (RegistryError, RuntimeError_, RuntimeTimeout) as exc:
            return f"pull of its state {reference} failed: {exc}", True
        return None, False

    def _have(self, image: str) -> bool:
        """Whether ``image`` is in this node's store (one bounded call); a runtime that
        does not answer counts as having it: the start then says what is wrong."""
        try:
            self.work.rt.image_config(image, timeout=self.work.call_timeout)
        except NotFound:
            return False
        except RuntimeError_ as exc:
            log.warning("image %s: cannot tell whether it is here: %s", image, exc)
        return True

    def _back_off(self, sb: Mapping[str, Any], error: str) -> None:
        """Record a failed pull of ``sb``'s state and when it is tried again."""
        uid, now = sb["metadata"]["uid"], self.work.status.clock()
        retry = next_pull_retry(self._pull_retries.get(uid), now)
        self._pull_retries[uid] = retry
        generation = (sb.get("metadata") or {}).get("generation")
        condition = pull_backoff_condition(self.work.node, generation, error, retry, now)
        outcome = self._write(sb, [condition], {})
        log.warning("sandbox %s: %s, condition %s", key_of(sb), condition.message, outcome)
        self.wake_in((retry.not_before - now).total_seconds())

    def _step(self, sb: Mapping[str, Any], container: ContainerInfo | None) -> SuspendStep | None:
        waking = self.idle is not None and self.idle.waking(key_of(sb))
        return decide_suspension(
            effective_mode(sb, waking),
            recorded_suspended(sb),
            container is not None,
            suspend_failed(sb),
        )

    def _write(
        self, sb: Mapping[str, Any], conditions: list[Condition], fields: Mapping[str, Any]
    ) -> WriteOutcome:
        status = self.work.status

        def merged(current: Mapping[str, Any]) -> dict[str, Any]:
            existing = parse_conditions((current.get("status") or {}).get("conditions"))
            for condition in conditions:
                existing = set_condition(existing, condition, status.clock())
            return {**fields, "conditions": wire_conditions(existing)}

        return status.write(sb, merged, allowed_from=RUNNING_ONLY)

    def suspend(self, sb: Mapping[str, Any], container: ContainerInfo) -> SuspendStep | None:
        """Commit ``container``'s filesystem, say so, remove it (or only remove it when
        that was said already); the step taken, None when nothing was done."""
        step, key = self._step(sb, container), key_of(sb)
        if step is SuspendStep.REMOVE:
            log.info("sandbox %s: suspended already, removing container %s", key, container.id)
            self.work.teardown(container)
            return step
        if step is not SuspendStep.COMMIT:
            return None
        with self.streams.suspending(key) as begun:
            if not begun:  # the end of its streams wakes the sync
                log.info("sandbox %s: suspend waits for its streams to end", key)
                return None
            return step if self._commit(sb, container, idle=False) else None

    def suspend_idle(self, sb: Mapping[str, Any], container: ContainerInfo) -> SuspendStep | None:
        """Suspend a sandbox its agent found idle (``spec.idleAction: Suspend``), if it
        still is (no stream open, no use waiting): as ``suspend``, its condition
        saying ``Idle``. A commit the runtime refuses is not recorded (nobody asked for
        it): the idle loop pauses that sandbox from then on."""
        key = key_of(sb)
        if self.idle is None or not self.idle.begin(key):
            return None
        with self.streams.suspending(key) as begun:
            if not begun:  # in use again: not idle, and not due any more
                return None
            return SuspendStep.COMMIT if self._commit(sb, container, idle=True) else None

    def _commit(self, sb: Mapping[str, Any], container: ContainerInfo, *, idle: bool) -> bool:
        """Freeze, commit, record, remove; whether the container was removed."""
        key, work = key_of(sb), self.work
        generation = (sb.get("metadata") or {}).get("generation")
        rt, timeout = work.rt, work.call_timeout
        error: str | None = None
        try:
            task = rt.get_task(container.id, timeout=timeout)
            froze = task is not None and task.state is TaskState.RUNNING
            if froze:  # a frozen task's files hold still while they are read
                rt.pause_task(container.id, timeout=timeout)
            image = suspended_image_name(sb["metadata"]["uid"])
            try:
                digest = rt.commit_container(
                    container.id,
                    image,
                    {SUSPENDED_IMAGE_LABEL: key.replace("/", ".")},
                    timeout=self.commit_timeout,
                )
            except RuntimeError_:
                if froze:  # as it was: running
                    rt.resume_task(container.id, timeout=timeout)
                raise
        except RuntimeTimeout as exc:
            log.warning("sandbox %s: suspend got no answer: %s", key, exc)
            return False
        except RuntimeError_ as exc:
            error = str(exc)
            log.warning("sandbox %s: suspend refused: %s", key, exc)
            if idle and self.idle is not None:
                self.idle.refused(key)
                return False
        fields, note, retry = self._push(sb, image) if error is None else ({}, None, None)
        if idle and error is None:
            seconds = (sb.get("spec") or {}).get("idleTimeoutSeconds") or 0
            condition = idle_suspend_condition(
                work.node, timedelta(seconds=int(seconds)), generation, note
            )
        else:
            condition = suspended_condition(True, work.node, generation, error, note)
        if retry is not None:  # owed: written down, so a restarted agent pushes too
            condition = owing(condition)
            self.wake_in((retry.not_before - work.status.clock()).total_seconds())
        outcome = self._write(sb, [condition], fields)
        if error is not None or outcome is not WriteOutcome.WRITTEN:
            log.info("sandbox %s: suspend %s, condition %s", key, error or "done", outcome)
            if idle and error is None and froze:  # not said: running again, idle later
                with contextlib.suppress(RuntimeError_):
                    rt.resume_task(container.id, timeout=timeout)
            return False  # not said: the container stays, the next pass commits again
        log.info("sandbox %s: committed as %s, removing container %s", key, digest, container.id)
        work.teardown(container)
        if idle and self.idle is not None:
            self.idle.suspended(sb)
        return True

    def _adopt(self, key: str, container: ContainerInfo) -> dict[str, Any] | None:
        """Take over a container found beside ``key``'s Suspended record
        (``policy.lifecycle.left_behind``): the status fields of one whose task runs
        (thawed first when the commit froze it; its address was written with it, or
        is the node's); None when it cannot serve now (removed when its process is
        gone, so the next pass restores from the image; left while unreadable)."""
        rt, timeout = self.work.rt, self.work.call_timeout
        try:
            task = rt.get_task(container.id, timeout=timeout)
            what = left_behind(task.state if task is not None else None)
            if what is LeftBehind.THAW:
                rt.resume_task(container.id, timeout=timeout)
        except RuntimeError_ as exc:
            log.warning("sandbox %s: cannot take over container %s: %s", key, container.id, exc)
            return None
        if what is LeftBehind.REMOVE:
            log.info(
                "sandbox %s: container %s left by a suspension: removing it", key, container.id
            )
            self.work.teardown(container)
        if task is None or what in (LeftBehind.REMOVE, LeftBehind.WAIT):
            return None
        return {"containerId": container.id, "pid": task.pid}

    def restore(self, sb: Mapping[str, Any], container: ContainerInfo | None) -> SuspendStep | None:
        """Start ``sb`` again from its committed filesystem (or only say so when its
        container exists already); the step taken, None when nothing was done."""
        step, key = self._step(sb, container), key_of(sb)
        work, generation = self.work, (sb.get("metadata") or {}).get("generation")
        fields: dict[str, Any] = {}
        error: str | None = None
        if step is SuspendStep.RESTORE:
            uid = sb["metadata"]["uid"]
            if not pull_retry_due(self._pull_retries.get(uid), work.status.clock()):
                return None  # its pull backs off: the sync is woken when it is due
            image = suspended_image_name(uid)
            error, transient = self._pull(sb, image)
            if error is not None and transient:
                self._back_off(sb, error)
                return None
            self._pull_retries.pop(uid, None)
            started = None
            try:
                started = work.restart_from(sb, image) if error is None else None
            except StartFailed as exc:
                error = f"{exc.reason}: {exc}"
                log.warning("sandbox %s: restore refused: %s", key, error)
            if started is None and error is None:
                return None  # not now: the next pass tries again
            if started is not None:
                fields = {**started[1], "suspendedState": None}
        elif step is SuspendStep.RECORD_RESTORED and container is not None:
            adopted = self._adopt(key, container)
            if adopted is None:
                return None
            fields = {**adopted, "suspendedState": None}
        else:
            return None
        conditions = [suspended_condition(False, work.node, generation, error)]
        if error is None and recorded_paused(sb):  # its frozen processes are gone
            conditions.append(
                Condition(
                    type=ConditionType.PAUSED,
                    status="False",
                    reason=SuspendedReason.RESTORED,
                    message=f"started again on node {work.node} from its committed filesystem",
                    observed_generation=generation,
                )
            )
        outcome = self._write(sb, conditions, fields)
        log.info("sandbox %s: %s, condition %s", key, error or step, outcome)
        restored = outcome is WriteOutcome.WRITTEN and "suspendedState" in fields
        if restored:
            self._push_retries.pop(sb["metadata"]["uid"], None)  # running again: owed nothing
        return step

    def wait_for_room(self, sb: Mapping[str, Any], why: str) -> None:
        """Say on ``sb``'s Suspended condition why it is not running again yet, once
        (nothing is written while it already says so)."""
        generation = (sb.get("metadata") or {}).get("generation")
        condition = waiting_condition(self.work.node, generation, why)
        if says(sb, condition):
            return
        outcome = self._write(sb, [condition], {})
        log.info("sandbox %s: restore waits for room (%s), condition %s", key_of(sb), why, outcome)


__all__ = ["Suspensions"]
