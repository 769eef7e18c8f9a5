"""Hands out the host ID ranges of ``hostUsers: false`` sandboxes on this node.

The decision is ``policy.userns.pick_range``; this keeps what it decides from:
the ranges on the node's containers (their ``USERNS_LABEL``, so a restart forgets
nothing) and the ones reserved by starts whose container does not exist yet.
One lock spans the listing, the pick and the reservation, and a reservation is
released only after its start created its container (which then carries the
label) or gave up, so two concurrent starts never get one range.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from sandlot.adapters.runtime import ContainerInfo, RuntimeError_
from sandlot.agent.rules import StartFailed
from sandlot.api.keys import USERNS_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.policy.userns import IdRange, NoFreeRange, pick_range, with_user_namespace


def ranges_in_use(containers: Iterable[ContainerInfo]) -> list[IdRange]:
    found = (IdRange.from_label(c.labels.get(USERNS_LABEL, "")) for c in containers)
    return [r for r in found if r is not None]


class UserRanges:
    """Reservations of host ID ranges, by container id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserved: dict[str, IdRange] = {}

    def reserve(
        self, container_id: str, containers: Callable[[], Iterable[ContainerInfo]]
    ) -> IdRange:
        """A range for ``container_id`` that no container and no other start holds;
        raises ``NoFreeRange`` when there is none."""
        with self._lock:
            held = self._reserved.get(container_id)
            if held is not None:
                return held
            others = [r for k, r in self._reserved.items() if k != container_id]
            chosen = pick_range([*ranges_in_use(containers()), *others])
            self._reserved[container_id] = chosen
            return chosen

    def map(
        self,
        container_id: str,
        oci: dict[str, Any],
        labels: dict[str, str],
        containers: Callable[..., Iterable[ContainerInfo]],
        *,
        timeout: float = 5.0,
    ) -> dict[str, Any]:
        """``oci`` with a user namespace on a range reserved for ``container_id``,
        which ``labels`` (the container's) then record."""
        try:
            ids = self.reserve(container_id, lambda: containers(timeout=timeout))
        except NoFreeRange as exc:
            raise StartFailed(SandboxReason.USER_NAMESPACES_UNSUPPORTED, str(exc)) from None
        except RuntimeError_ as exc:
            raise StartFailed(
                SandboxReason.CREATE_FAILED, f"cannot list containers: {exc}"
            ) from None
        labels[USERNS_LABEL] = ids.label()
        return with_user_namespace(oci, ids)

    def release(self, container_id: str) -> None:
        with self._lock:
            self._reserved.pop(container_id, None)


__all__ = ["UserRanges", "ranges_in_use"]
