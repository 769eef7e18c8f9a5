"""The work items the sync hands to the pool: start, stop, fence and tear down.

Each runs on a pool thread for one sandbox at a time (``loops.WorkPool``). Two
halves that change apart: a start (``agent.starts``: checks, image, OCI spec,
network, container, task, Running) and a stop or teardown (``agent.stops``: a
graceful stop, a teardown, the end it writes). Pausing and suspending a running
sandbox are ``agent.modes`` and ``agent.suspend``, which use both. ``SandboxWork``
is the face the sync, the reaper, the suspensions and the storage pass call; its
two halves share only the Running bodies a start could not write yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandlot.adapters.runtime import ContainerInfo
from sandlot.agent.starts import NodeFacts, StartFailed, Starts, container_id_for
from sandlot.agent.stops import Stops
from sandlot.agent.teardown import TeardownResult


class SandboxWork:
    """This node's sandbox operations: the two halves of its work, built over one
    runtime and one API (``starts`` over ``stops``, whose teardown it undoes with)."""

    def __init__(self, starts: Starts, stops: Stops) -> None:
        self.starts = starts
        self.stops = stops
        self.settings = stops.settings
        self.node = stops.node
        self.objects = stops.objects
        self.rt = stops.rt
        self.status = stops.status
        self.metrics = stops.metrics
        self.call_timeout = stops.call_timeout
        self.facts = starts.facts
        self.rules = starts.rules
        self.network_policies = starts.network_policies
        self.runtime_classes = starts.runtime_classes

    # ------------------------------------------------------------ start (agent.starts)

    def start_sandbox(self, sb: Mapping[str, Any]) -> None:
        self.starts.start_sandbox(sb)

    def restart_from(
        self, sb: Mapping[str, Any], image: str
    ) -> tuple[ContainerInfo, dict[str, Any]] | None:
        return self.starts.restart_from(sb, image)

    def teardown_unstarted(self, key: str, container: ContainerInfo) -> None:
        self.starts.teardown_unstarted(key, container)

    def hold(self, sb: Mapping[str, Any], reason: str, message: str) -> None:
        self.starts.hold(sb, reason, message)

    def fail(self, sb: Mapping[str, Any], reason: str, message: str) -> None:
        self.starts.fail(sb, reason, message)

    # ------------------------------------------------------------ stop (agent.stops)

    def teardown(
        self, container: ContainerInfo | str, *, release_patience: float = -1
    ) -> TeardownResult:
        return self.stops.teardown(container, release_patience=release_patience)

    def read_again(self, key: str, container: ContainerInfo) -> dict[str, Any] | None:
        return self.stops.read_again(key, container)

    def stop_deleted(self, key: str, container: ContainerInfo) -> None:
        self.stops.stop_deleted(key, container)

    def stop_sandbox(self, sb: Mapping[str, Any], container: ContainerInfo, reason: str) -> None:
        self.stops.stop_sandbox(sb, container, reason)

    def stop_ended(self, sb: Mapping[str, Any], container: ContainerInfo) -> None:
        self.stops.stop_ended(sb, container)

    def end_lost(self, key: str) -> None:
        self.stops.end_lost(key)

    def refuse_drained(self, sb: Mapping[str, Any], reason: str) -> None:
        self.stops.refuse_drained(sb, reason)

    def end_drained(self, sb: Mapping[str, Any], reason: str) -> None:
        self.stops.end_drained(sb, reason)


__all__ = ["NodeFacts", "SandboxWork", "StartFailed", "container_id_for"]
