"""Taking the SandboxSnapshots bound to this node, and the image a fork starts from.

A pass (every second, reading the watch caches only) hands each snapshot due to
the sandbox work pool under its sandbox's key, so a take never overlaps a suspend,
a restore or a stop of the same sandbox. The take says Taking, then commits: a
running sandbox is frozen for the length of the commit (its files hold still
while they are read) and thawed after, a paused one stays paused, a suspended
one's committed image is named again as the snapshot's. Then Ready with the image,
its digest and size; a refusal ends it Failed. A timeout writes nothing more: the
snapshot stays Taking and the next pass takes it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout, TaskState
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.statestore import StateStore
from sandlot.agent.stops import Stops
from sandlot.agent.workpools import SandboxPools
from sandlot.api.common import join_key, key_of, split_key
from sandlot.api.reasons import SnapshotReason
from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.api.snapshot import SnapshotPhase
from sandlot.policy.snapshots import (
    SNAPSHOT_IMAGE_LABEL,
    TakeStep,
    fork_image,
    snapshot_image_name,
    snapshot_ref,
    snapshot_status,
    take_step,
)
from sandlot.policy.suspension import (
    PullRetry,
    next_pull_retry,
    pull_retry_due,
    recorded_suspended,
    suspended_image_name,
)

log = logging.getLogger(__name__)

SNAPSHOT_TICK = 1.0
"""Seconds between passes (each reads the watch caches only)."""
KEY_WAIT = timedelta(seconds=30)
"""How long a take waits for the snapshot's state key before it is taken unpushed."""


class Snapshots:
    """Takes this node's snapshots through ``work``'s runtime, and finds the image a
    forked sandbox starts from (``fork_image``, handed to the starts: built before
    them, over the node's stops, which hold the runtime, API and settings)."""

    def __init__(
        self,
        work: Stops,
        pool: SandboxPools,
        snapshots: WatchCache,
        sandboxes: WatchCache,
        clock: Callable[[], datetime],
        store: StateStore | None = None,
    ) -> None:
        self.work, self.pool, self.clock = work, pool, clock
        self.snapshots, self.sandboxes = snapshots, sandboxes
        self.commit_timeout = work.settings.image_pull_deadline.total_seconds()
        self.store = store  # the state repository: snapshots pushed there fork anywhere
        self._ended: set[str] = set()  # uids made Ready or Failed here (the cache may lag)
        self._pulled: dict[str, str] = {}  # "ns/name" -> uid of a snapshot pulled here
        self._retries: dict[str, PullRetry] = {}  # "ns/name" -> a failed pull's back-off
        self._key_waits: dict[str, datetime] = {}  # uid -> since when its take waits for a key

    def live_uids(self) -> frozenset[str] | None:
        """This node's SandboxSnapshots' uids, and those of snapshots pulled here that a
        sandbox on this node still forks from; None until the watches have listed."""
        if not (self.snapshots.synced.is_set() and self.sandboxes.synced.is_set()):
            return None
        live = {str(o["metadata"]["uid"]) for o in self.snapshots.items()}
        forking = {
            join_key(sb["metadata"]["namespace"], str(snapshot_ref(sb.get("spec") or {})))
            for sb in self.sandboxes.items()
            if (sb.get("status") or {}).get("phase") not in TERMINAL_PHASES
        }
        return frozenset(live | {uid for key, uid in self._pulled.items() if key in forking})

    def fork_image(self, sb: Mapping[str, Any]) -> str | None:
        """The image forked ``sb`` starts from here; None: its snapshot is not usable on
        this node yet (not Ready; kept on another node and not pushed; its pull failed
        and backs off)."""
        name = snapshot_ref(sb.get("spec") or {})
        if name is None:
            return None
        key = join_key(sb["metadata"]["namespace"], name)
        snapshot = self.snapshots.get(key) or self._read(key)
        source = fork_image(snapshot, self.work.node)
        if source is None or source.pull is None:
            return source.image if source is not None else None
        assert snapshot is not None  # a source came from it
        uid = str(snapshot["metadata"]["uid"])
        if self._pulled.get(key) == uid:
            return source.image
        return source.image if self._pull(key, uid, source.pull, source.image) else None

    def _read(self, key: str) -> Mapping[str, Any] | None:
        """A snapshot bound to another node (this node's watch holds only its own)."""
        namespace, name = split_key(key)
        try:
            return self.work.objects.get_snapshot(namespace, name)
        except Exception as exc:
            log.warning("snapshot %s: cannot read it: %s", key, exc)
            return None

    def _pull(self, key: str, uid: str, reference: str, image: str) -> bool:
        """Pull the pushed snapshot into this node's store, backing off after a failure."""
        now = self.clock()
        if self.store is None:
            log.warning(
                "snapshot %s: pushed to %s; this node has no state repository", key, reference
            )
            return False
        if not pull_retry_due(self._retries.get(key), now):
            return False
        try:
            self.store.pull(reference, image, uid)
        except (RegistryError, RuntimeError_, RuntimeTimeout) as exc:
            retry = next_pull_retry(self._retries.get(key), now)
            self._retries[key] = retry
            log.warning(
                "snapshot %s: pull of %s failed (%s); tried again after %s",
                key,
                reference,
                exc,
                retry.not_before.isoformat(),
            )
            return False
        self._retries.pop(key, None)
        self._pulled[key] = uid
        log.info("snapshot %s: pulled %s as %s", key, reference, image)
        return True

    def pass_once(self) -> None:
        if not (self.snapshots.synced.is_set() and self.sandboxes.synced.is_set()):
            return
        for snapshot in self.snapshots.items():
            meta = snapshot["metadata"]
            key = join_key(meta["namespace"], str((snapshot.get("spec") or {}).get("sandboxName")))
            sb = self.sandboxes.get(key)
            if meta["uid"] in self._ended or take_step(snapshot, sb, True, False) is None:
                continue
            self.pool.submit(key, partial(self.take, key_of(snapshot), key))

    def _write(self, snapshot: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = snapshot["metadata"]
        if status["phase"] != SnapshotPhase.TAKING:
            self._ended.add(meta["uid"])
        self.work.objects.patch_snapshot(
            meta["namespace"], meta["name"], {"status": dict(status)}, status=True
        )

    def take(self, key: str, sb_key: str) -> None:
        """Take snapshot ``key`` of sandbox ``sb_key`` (both re-read from the caches:
        the pass that queued it may be old)."""
        snapshot, sb = self.snapshots.get(key), self.sandboxes.get(sb_key)
        if snapshot is None:
            return
        rt, timeout = self.work.rt, self.work.call_timeout
        cid = container_id_for(sb["metadata"]["uid"]) if sb is not None else ""
        task = rt.get_task(cid, timeout=timeout) if sb is not None else None
        suspended = sb is not None and recorded_suspended(sb) and task is None
        step = take_step(snapshot, sb, task is not None, suspended)
        if step is None or step is TakeStep.WAIT:
            return
        if step is TakeStep.FAIL:
            message = f"sandbox {sb_key} is gone or has ended"
            log.info("snapshot %s: %s", key, message)
            self._write(
                snapshot,
                snapshot_status(SnapshotPhase.FAILED, SnapshotReason.SANDBOX_NOT_FOUND, message),
            )
            return
        if not self._key_here(key, str(snapshot["metadata"]["uid"])):
            return
        node = self.work.node
        self._write(
            snapshot,
            snapshot_status(SnapshotPhase.TAKING, SnapshotReason.TAKING, f"taking on node {node}"),
        )
        image = snapshot_image_name(snapshot["metadata"]["uid"])
        labels = {SNAPSHOT_IMAGE_LABEL: key.replace("/", ".")}
        try:
            if step is TakeStep.COPY:
                source = suspended_image_name(sb["metadata"]["uid"])  # type: ignore[index]
                digest = rt.copy_image(source, image, labels, timeout=self.commit_timeout)
            else:
                frozen = task is not None and task.state is TaskState.RUNNING
                digest = self._commit(cid, image, labels, frozen)
        except RuntimeTimeout as exc:
            log.warning("snapshot %s: the commit got no answer: %s", key, exc)
            return
        except RuntimeError_ as exc:
            log.warning("snapshot %s: refused: %s", key, exc)
            message = f"taking on node {node} failed: {exc}"
            self._write(
                snapshot, snapshot_status(SnapshotPhase.FAILED, SnapshotReason.TAKE_FAILED, message)
            )
            return
        size = self._size(image)
        log.info("snapshot %s of %s taken: %s (%s bytes)", key, sb_key, digest, size)
        fields: dict[str, Any] = {
            "imageRef": image,
            "digest": digest,
            "takenAt": self.clock().isoformat(),
        }
        if size is not None:
            fields["sizeBytes"] = size
        pushed, note = self._push(key, snapshot["metadata"]["uid"], image)
        fields.update(pushed)
        message = f"kept on node {node} as {image}{note}"
        self._write(
            snapshot, snapshot_status(SnapshotPhase.READY, SnapshotReason.TAKEN, message, **fields)
        )

    def _key_here(self, key: str, uid: str) -> bool:
        """Whether the take may begin: the snapshot's state key is here to seal its
        push, or it was waited for ``KEY_WAIT`` already (taken then, kept here only)."""
        if self.store is None or self.store.has_key(uid):
            self._key_waits.pop(uid, None)
            return True
        since = self._key_waits.setdefault(uid, self.clock())
        if self.clock() - since < KEY_WAIT:
            log.info("snapshot %s: waiting for its state key", key)
            return False
        log.warning("snapshot %s: no state key brokered within %s: taken unpushed", key, KEY_WAIT)
        return True

    def _push(self, key: str, uid: str, image: str) -> tuple[dict[str, str], str]:
        """Push the taken image when this node has a state repository: the status
        field saying where, and a note for the message."""
        if self.store is None:
            return {}, ""
        try:
            pushed = self.store.push(uid, f"snapshot-{uid}", image)
        except (RegistryError, RuntimeError_, RuntimeTimeout) as exc:
            log.warning("snapshot %s: not pushed: %s", key, exc)
            return {}, f"; not pushed ({exc}): only this node forks it"
        return {"pushedImage": pushed.reference}, f", pushed to {pushed.reference}"

    def _commit(self, cid: str, image: str, labels: Mapping[str, str], frozen: bool) -> str:
        """Commit ``cid``; a running task (``frozen``) is paused for the length of it."""
        rt, timeout = self.work.rt, self.work.call_timeout
        if frozen:
            rt.pause_task(cid, timeout=timeout)
        try:
            return rt.commit_container(cid, image, labels, timeout=self.commit_timeout)
        finally:
            if frozen:
                rt.resume_task(cid, timeout=timeout)

    def _size(self, image: str) -> int | None:
        try:
            records = self.work.rt.list_images(timeout=self.work.call_timeout)
        except RuntimeError_ as exc:
            log.warning("snapshot image %s: cannot read its size: %s", image, exc)
            return None
        return next((r.size for r in records if r.name == image), None)


__all__ = ["SNAPSHOT_TICK", "Snapshots"]
