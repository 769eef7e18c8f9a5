"""Conditions with Kubernetes' semantics (``meta.SetStatusCondition``), in one place.

A condition's ``lastTransitionTime`` says when its *status* last changed: a new
reason or message for the same status is news, not a transition, so it keeps
the time. Clients compute "NotReady for how long" from it; resetting it on
every reworded message would make that answer wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sandlot.api.common import Condition


def set_condition(
    conditions: Iterable[Condition], new: Condition, now: datetime
) -> tuple[Condition, ...]:
    """``conditions`` with ``new`` merged in by type.

    An existing condition of that type keeps its place and its
    ``lastTransitionTime`` unless the status changes (then it becomes ``new``'s
    time, or ``now``); reason and message are replaced; ``observedGeneration``
    follows ``new`` when it has one. A new type is appended.
    """
    current = tuple(conditions)
    existing = next((c for c in current if c.type == new.type), None)
    if existing is None:
        stamped = new.model_copy(update={"last_transition_time": new.last_transition_time or now})
        return (*current, stamped)
    transition = (
        existing.last_transition_time
        if existing.status == new.status and existing.last_transition_time is not None
        else new.last_transition_time or now
    )
    generation = (
        new.observed_generation
        if new.observed_generation is not None
        else existing.observed_generation
    )
    merged = new.model_copy(
        update={"last_transition_time": transition, "observed_generation": generation}
    )
    return tuple(merged if c.type == new.type else c for c in current)


def remove_condition(conditions: Iterable[Condition], type_: str) -> tuple[Condition, ...]:
    return tuple(c for c in conditions if c.type != type_)


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def parse_conditions(raw: Iterable[Mapping[str, Any]] | None) -> tuple[Condition, ...]:
    """Conditions as stored on the wire (camelCase dicts)."""
    return tuple(Condition.model_validate(c) for c in raw or ())


def wire_conditions(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    return [c.wire() for c in conditions]
