"""The SandboxSnapshot controller: binds a snapshot to its sandbox's node, and keeps
it while anything forks from it.

Decisions come from ``sandlot.policy.snapshots.decide_snapshot``. A new snapshot
gets the ``sandlot.dev/snapshot-in-use`` finalizer at once and, once its sandbox
has a node, ``spec.nodeName`` (that node's agent then takes it); a snapshot whose
sandbox does not exist or has ended is Failed. A deleted snapshot keeps its
finalizer while a live Sandbox or a pool template of its namespace names it; the
last one gone, the finalizer goes, the object with it, and the node's image
collector removes the image at its next pass.

It runs on kopf events (a snapshot changed), on the sandbox cache's (a fork
changed or went)
and on a short resync of the snapshots still open or being deleted. Only the
leader acts; every write carries the resourceVersion read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf

from sandlot.adapters.objects import Objects
from sandlot.api.common import (
    GROUP,
    POOLS,
    SANDBOXES,
    SNAPSHOTS,
    VERSION,
    join_key,
    key_of,
    split_key,
)
from sandlot.api.keys import SNAPSHOT_FINALIZER
from sandlot.api.reasons import SnapshotReason
from sandlot.api.snapshot import TERMINAL_SNAPSHOT_PHASES, SnapshotPhase
from sandlot.controllers.kopfhandlers import resync_while_operating
from sandlot.controllers.ownwork import CoalescedRuns
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord
from sandlot.policy.snapshots import (
    SnapshotDecision,
    decide_snapshot,
    referrers,
    snapshot_status,
)

log = logging.getLogger(__name__)

RESYNC_SECONDS = 2.0


def _settled(body: Mapping[str, Any]) -> bool:
    """Nothing left to do until something changes: final, held, not being deleted."""
    meta = body.get("metadata") or {}
    return (
        not meta.get("deletionTimestamp")
        and SNAPSHOT_FINALIZER in (meta.get("finalizers") or ())
        and (body.get("status") or {}).get("phase") in TERMINAL_SNAPSHOT_PHASES
    )


class SnapshotController:
    def __init__(self, objects: Objects, leading: Callable[[], bool]) -> None:
        self.objects, self.leading = objects, leading
        self.open: set[str] = set()
        """Snapshots (``ns/name``) that are not settled: resynced."""
        self.runs = CoalescedRuns(
            self.reconcile, leading, kind="SandboxSnapshot", task_prefix="snapshot", log=log
        )

    def on_snapshot(self, event_type: str, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if event_type == "DELETED" or _settled(body):
            self.open.discard(key)
            return
        self.open.add(key)
        self.kick(key)

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        """A fork changed or went: its snapshot may be free to go."""
        for rec in (old, new):
            if rec is not None and rec.snapshot is not None:
                self.kick(join_key(rec.namespace, rec.snapshot))

    def kick(self, key: str) -> None:
        self.runs.kick(key)

    def kick_open(self) -> None:
        for key in list(self.open):
            self.kick(key)

    # -- the work (synchronous: runs in a thread) ---------------------------------

    def reconcile(self, key: str) -> SnapshotDecision | None:
        namespace, name = split_key(key)
        body = self.objects.get_snapshot(namespace, name)
        if body is None:
            self.open.discard(key)
            return None
        meta = body["metadata"]
        keepers: list[str] = []
        sandbox = None
        if meta.get("deletionTimestamp"):
            keepers = referrers(
                name,
                self.objects.list_namespaced(SANDBOXES, namespace),
                self.objects.list_namespaced(POOLS, namespace),
            )
        elif not (body.get("spec") or {}).get("nodeName"):
            sandbox = self.objects.find_sandbox(namespace, str(body["spec"]["sandboxName"]))
        decision = decide_snapshot(body, sandbox, keepers)
        self._apply(key, body, decision, keepers)
        return decision

    def _apply(
        self, key: str, body: Mapping[str, Any], decision: SnapshotDecision, keepers: list[str]
    ) -> None:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        rv = {"resourceVersion": meta["resourceVersion"]}
        finalizers = list(meta.get("finalizers") or ())
        if decision.remove_finalizer:
            kept = [f for f in finalizers if f != SNAPSHOT_FINALIZER]
            self.objects.patch_snapshot(namespace, name, {"metadata": {**rv, "finalizers": kept}})
            log.info("SandboxSnapshot %s: nothing refers to it, letting it go", key)
            return
        if meta.get("deletionTimestamp") and keepers:
            log.info("SandboxSnapshot %s: deletion waits for %s", key, ", ".join(keepers))
        patch: dict[str, Any] = {}
        if decision.add_finalizer:
            patch["metadata"] = {**rv, "finalizers": [*finalizers, SNAPSHOT_FINALIZER]}
        if decision.node is not None:
            patch["spec"] = {"nodeName": decision.node}
            patch.setdefault("metadata", rv)
            log.info("SandboxSnapshot %s bound to node %s", key, decision.node)
        if patch:
            body = self.objects.patch_snapshot(namespace, name, patch)
        if decision.fail is not None:
            log.info("SandboxSnapshot %s failed: %s", key, decision.fail)
            status = snapshot_status(
                SnapshotPhase.FAILED, SnapshotReason.SANDBOX_NOT_FOUND, decision.fail
            )
            self.objects.patch_snapshot(
                namespace,
                name,
                {
                    "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                    "status": status,
                },
                status=True,
            )


def register(
    registry: kopf.OperatorRegistry,
    objects: Objects,
    leading: Callable[[], bool],
    sandboxes: SandboxCache | None = None,
    listeners: Sequence[Callable[[str, Mapping[str, Any]], None]] = (),
) -> SnapshotController:
    """Add the SandboxSnapshot handlers to ``registry`` (and a listener of the
    sandbox cache, when there is one); ``listeners`` hear every snapshot event."""
    controller = SnapshotController(objects, leading)
    if sandboxes is not None:
        sandboxes.listeners.append(controller.on_sandbox)

    @kopf.on.event(GROUP, VERSION, SNAPSHOTS, registry=registry)
    async def snapshot_event(body: kopf.Body, **kwargs: Any) -> None:
        event = kwargs.get("type") or "MODIFIED"
        controller.on_snapshot(event, body)
        for listener in listeners:
            listener(event, body)

    resync_while_operating(
        registry, controller.kick_open, leading, interval=RESYNC_SECONDS, name="snapshot_resync"
    )

    return controller


__all__ = ["SnapshotController", "register"]
