"""Applying a sandbox's operating mode: freeze or thaw its task, then say so.

The sync submits this only when the spec's mode differs from what the Paused
condition records (``policy.operatingmode``), so the task is all but always in
the other state: the pause or resume is called at once (``mode_call``), and the
task is read only when the runtime refuses it, to tell a task already as asked
(a pause that landed unanswered, an idle freeze a Paused spec takes over), one
not live or still freezing, from a true refusal (``decide_mode``). One containerd
call on the usual path, every call bounded. A timeout writes nothing (the next
pass tries again); a refusal is recorded with the spec's generation. The
condition is merged into the Sandbox's conditions as last read, and written only
while it is Running here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sandlot.adapters.runtime import ContainerInfo, Runtime, RuntimeError_, RuntimeTimeout
from sandlot.adapters.statuswrite import WriteOutcome
from sandlot.agent.loops import SETTLED
from sandlot.agent.status import StatusWriter
from sandlot.api.common import key_of
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions
from sandlot.policy.operatingmode import (
    ModeStep,
    decide_mode,
    mode_call,
    mode_settled,
    paused_condition,
    wanted_mode,
)

log = logging.getLogger(__name__)

RUNNING_ONLY = frozenset({SandboxPhase.RUNNING})


class ModeChanges:
    """Pauses and resumes this node's sandboxes; ``rt`` gives the connected runtime."""

    def __init__(
        self,
        rt: Runtime,
        status: StatusWriter,
        node: str,
        call_timeout: float,
        *,
        in_use: Callable[[], Collection[str]] = frozenset,
        thaws: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.rt = rt
        self.status = status
        self.node = node
        self.call_timeout = call_timeout
        # The sandboxes streams use and the lock thaws for use take (``agent.uses``): a
        # pause is held off while a stream uses the sandbox, and never lands on a
        # thaw's heels.
        self.in_use = in_use
        self.thaws: AbstractContextManager[Any] = thaws if thaws is not None else nullcontext()

    def apply(self, sb: Mapping[str, Any], container: ContainerInfo) -> ModeStep | None:
        """Bring ``container``'s task to the mode ``sb`` asks for; the step taken, or
        None when containerd did not answer (nothing written: the next pass retries)."""
        return self._apply(sb, container)[0]

    def settle(self, sb: Mapping[str, Any], container: ContainerInfo) -> object:
        """``apply``, as the sandbox's work: ``SETTLED`` once the task is as asked and
        the condition says so (``mode_settled``), so its end wakes no pass; else the
        step (None: no answer), and a pass follows."""
        step, outcome = self._apply(sb, container)
        return SETTLED if mode_settled(step, outcome is WriteOutcome.WRITTEN) else step

    def _apply(
        self, sb: Mapping[str, Any], container: ContainerInfo
    ) -> tuple[ModeStep | None, WriteOutcome | None]:
        key, mode = key_of(sb), wanted_mode(sb)
        step = mode_call(mode)
        if step is ModeStep.PAUSE:
            with self.thaws:
                if key in self.in_use():  # thawed for a stream: frozen after it
                    log.info("sandbox %s: pause waits for its streams to end", key)
                    return ModeStep.WAIT, None
                done = self._call(key, mode, container, step)
        else:
            done = self._call(key, mode, container, step)
        if done is None:
            return None, None
        step, error = done
        if step in (ModeStep.LEAVE, ModeStep.WAIT):
            log.info("sandbox %s: %s left for now (%s)", key, mode, step)
            return step, None
        generation = (sb.get("metadata") or {}).get("generation")
        condition = paused_condition(mode, self.node, generation, error)

        def merged(current: Mapping[str, Any]) -> dict[str, Any]:
            existing = parse_conditions((current.get("status") or {}).get("conditions"))
            return {
                "conditions": wire_conditions(
                    set_condition(existing, condition, self.status.clock())
                )
            }

        outcome = self.status.write(sb, merged, allowed_from=RUNNING_ONLY)
        log.info("sandbox %s: %s (%s), condition %s", key, mode, step, outcome)
        return step, outcome

    def _call(
        self, key: str, mode: OperatingMode, container: ContainerInfo, step: ModeStep
    ) -> tuple[ModeStep, str | None] | None:
        """Make ``step``'s call; the step as it stands and the runtime's refusal, if
        any; None when containerd did not answer."""
        call = self.rt.pause_task if step is ModeStep.PAUSE else self.rt.resume_task
        try:
            call(container.id, timeout=self.call_timeout)
            return step, None
        except RuntimeTimeout as exc:
            log.warning("sandbox %s: %s got no answer: %s", key, step, exc)
            return None
        except RuntimeError_ as exc:
            refusal = exc
        try:
            task = self.rt.get_task(container.id, timeout=self.call_timeout)
        except RuntimeError_ as exc:
            log.warning("sandbox %s: %s refused (%s), its task unread: %s", key, step, refusal, exc)
            return None
        after = decide_mode(mode, task.state if task is not None else None)
        if after is step:  # the task was in the state to act: the runtime refused it
            log.warning("sandbox %s: %s refused: %s", key, step, refusal)
            return step, str(refusal)
        return after, None


__all__ = ["ModeChanges"]
