"""Applying a sandbox's operating mode: freeze or thaw its task, then say so.

The sync submits this only when the spec's mode differs from what the Paused
condition records (``policy.operatingmode``); the work reads the one task, asks
``decide_mode`` and makes at most one containerd call, bounded like every other.
A timeout writes nothing (the next pass tries again); a refusal is recorded with
the spec's generation. The condition is merged into the Sandbox's conditions as
last read, and written only while it is Running here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sandlot.adapters.runtime import ContainerInfo, Runtime, RuntimeError_, RuntimeTimeout
from sandlot.agent.status import StatusWriter
from sandlot.api.common import key_of
from sandlot.api.sandbox import SandboxPhase
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions
from sandlot.policy.operatingmode import ModeStep, decide_mode, paused_condition, wanted_mode

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
        key, mode = key_of(sb), wanted_mode(sb)
        rt = self.rt
        try:
            task = rt.get_task(container.id, timeout=self.call_timeout)
        except RuntimeError_ as exc:
            log.warning("sandbox %s: cannot read its task to apply %s: %s", key, mode, exc)
            return None
        step = decide_mode(mode, task.state if task is not None else None)
        if step in (ModeStep.LEAVE, ModeStep.WAIT):
            log.info("sandbox %s: %s left for now (task %s)", key, mode, task)
            return step
        error: str | None = None
        try:
            if step is ModeStep.PAUSE:
                with self.thaws:
                    if key in self.in_use():  # thawed for a stream: frozen after it
                        log.info("sandbox %s: pause waits for its streams to end", key)
                        return ModeStep.WAIT
                    rt.pause_task(container.id, timeout=self.call_timeout)
            elif step is ModeStep.RESUME:
                rt.resume_task(container.id, timeout=self.call_timeout)
        except RuntimeTimeout as exc:
            log.warning("sandbox %s: %s got no answer: %s", key, step, exc)
            return None
        except RuntimeError_ as exc:
            error = str(exc)
            log.warning("sandbox %s: %s refused: %s", key, step, exc)
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
        return step


__all__ = ["ModeChanges"]
