"""The agent's image collector: one pass = protect, plan once, delete, measure.

It wires the pure policy in ``sandlot.policy.imagegc`` to the ``Runtime``
boundary. The protected set is built from the images of *every* existing
container, so a pass whose container listing fails aborts with nothing deleted:
proceeding against an empty protected set would evict images under running
sandboxes. One failed delete does not stop the pass. Deletes remove records only;
the pass then asks containerd for one garbage collection and waits for it (a
collection per delete would cost the pass nearly all its time), so the bytes
freed, measured on the filesystem after it, are really free. They are never only
estimated from image sizes (images share layers, so sizes over-count).

The forced pass (an operator's ``--all``) forces the policy, not the safety. It
ignores the exhausted backoff (that failsafe stops the agent's own timer from
spinning on a store it cannot shrink; a human asking is not that timer), never
arms it, and clears it once it has disproved it. It has no byte budget, so its log
line carries no ``bytes_to_free``: a "0" there would read as "nothing to reclaim"
on exactly the pass an operator runs believing there is.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from prometheus_client import CollectorRegistry

from sandlot.adapters.runtime import ImageRecord, NotFound, Runtime
from sandlot.agent.imagetouch import TouchLog
from sandlot.agent.metrics import GcMetrics
from sandlot.api.cacheprune import NodePruneResult
from sandlot.api.keys import LAST_USED_LABEL
from sandlot.api.node import HeldBackBytes, NodeGcStatus
from sandlot.api.timestamps import rfc3339, utcnow
from sandlot.policy import imagegc as gcpolicy
from sandlot.policy.imagegc import (
    DiskUsage,
    GcPlan,
    GcThresholds,
    HoldReason,
    PassKind,
    ProtectedSet,
)
from sandlot.policy.snapshots import orphaned_snapshot_images
from sandlot.policy.suspension import orphaned_images

log = logging.getLogger(__name__)

_MAX_ERRORS_SHOWN = 5


class GcOutcome(StrEnum):
    OK = "ok"
    """Removed at least one record."""
    NOTHING_TO_DO = "nothing-to-do"
    """No pressure (watermark) or nothing unprotected (forced)."""
    EXHAUSTED = "exhausted"
    """Took everything it could and the disk is still over the line: backoff armed."""
    ABORTED = "aborted"
    """Could not read containers, images or the disk before deleting; nothing deleted."""
    ERROR = "error"
    """Ran, but a delete or the closing disk measurement failed."""
    SKIPPED = "skipped"
    """Automatic pass not run: the exhausted backoff is armed."""
    DISABLED = "disabled"
    """The collector is disabled; nothing ran."""


@dataclass(frozen=True)
class GcResult:
    """What one pass did, and why it did not do more."""

    kind: PassKind
    outcome: GcOutcome
    started_at: datetime
    records_removed: int = 0
    removed: tuple[str, ...] = ()
    bytes_freed: int = 0
    """Measured: used bytes before the deletes minus used bytes after (floor 0)."""
    bytes_to_free: int | None = None
    """The watermark pass's budget; ``None`` for the forced pass or when nothing was planned."""
    held_back: Mapping[HoldReason, int] = field(default_factory=dict)
    non_image_bytes: int = 0
    """Used bytes on the filesystem not accounted for by the remaining images (floor 0)."""
    usage_after: DiskUsage | None = None
    exhausted_until: datetime | None = None
    error: str | None = None
    finished_at: datetime | None = None

    @property
    def ran(self) -> bool:
        """False for a skipped or disabled pass: it should not replace the last pass's status."""
        return self.outcome not in (GcOutcome.SKIPPED, GcOutcome.DISABLED)

    def held_back_model(self) -> HeldBackBytes:
        return HeldBackBytes(
            in_use=self.held_back.get(HoldReason.IN_USE, 0),
            pinned=self.held_back.get(HoldReason.PINNED, 0),
            live_job=self.held_back.get(HoldReason.LIVE_JOB, 0),
            too_young=self.held_back.get(HoldReason.TOO_YOUNG, 0),
        )

    def to_prune_result(self, completed_at: datetime | None = None) -> NodePruneResult:
        """This pass as a node's entry in ``CachePrune.status.results``."""
        return NodePruneResult.model_validate(
            {
                "pass": self.kind,
                "records_removed": self.records_removed,
                "bytes_freed": self.bytes_freed,
                "held_back": self.held_back_model(),
                "error": self.error,
                "completed_at": completed_at or self.finished_at or self.started_at,
            }
        )

    def to_node_gc_status(self) -> NodeGcStatus:
        """This pass as ``SandboxNode.status.gc`` (only meaningful when ``ran``)."""
        return NodeGcStatus(
            last_pass_time=self.finished_at or self.started_at,
            last_pass_kind=self.kind,
            last_pass_outcome=self.outcome.value,
            records_removed=self.records_removed,
            bytes_freed=self.bytes_freed,
            held_back=self.held_back_model(),
            non_image_bytes=self.non_image_bytes,
            disk_usage_percent=round(self.usage_after.percent, 2) if self.usage_after else None,
            exhausted_until=self.exhausted_until,
        )


def disk_usage_of(path: str) -> DiskUsage:
    """Usage of the filesystem holding ``path`` (containerd's root).

    Blocks reserved for root count as used, as kubelet counts them: free is what
    can actually be written.
    """
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    available = st.f_bavail * st.f_frsize
    return DiskUsage(total_bytes=total, used_bytes=max(0, total - available))


class _Abort(Exception):
    pass


class ImageCollector:
    """Runs image GC passes against a ``Runtime``. Passes are serialized."""

    def __init__(
        self,
        runtime: Runtime,
        disk_usage: Callable[[], DiskUsage],
        thresholds: GcThresholds | None = None,
        *,
        pinned: Iterable[str] = (),
        live_job_prefixes: Iterable[str] = (),
        clock: Callable[[], datetime] = utcnow,
        call_timeout: float = 10.0,
        disabled: bool = False,
        metrics: GcMetrics | None = None,
        exhausted_until: datetime | None = None,
        starting: Callable[[], Iterable[str]] = frozenset,
        live_uids: Callable[[], Collection[str] | None] = lambda: None,
        live_snapshots: Callable[[], Collection[str] | None] = lambda: None,
    ) -> None:
        if call_timeout <= 0:
            raise ValueError(f"call_timeout must be > 0 seconds, got {call_timeout}")
        self._runtime = runtime
        self._disk_usage = disk_usage
        self.thresholds = thresholds or GcThresholds()
        self.pinned = frozenset(p for p in pinned if p)
        self.live_job_prefixes = tuple(p for p in live_job_prefixes if p)
        self._clock = clock
        self._timeout = call_timeout
        self.disabled = disabled
        # A private registry unless one is given: never the process-wide default by accident.
        self._metrics = metrics or GcMetrics(CollectorRegistry())
        self._exhausted_until = exhausted_until
        # Images being pulled or started from: in use before any container holds them.
        self._starting = starting
        # The node's non-terminal Sandboxes' uids (None: not known yet): a committed
        # image of any other is an orphan, removed by every pass.
        self._live_uids = live_uids
        self._live_snapshots = live_snapshots  # the node's SandboxSnapshots' uids, as above
        self._lock = threading.Lock()
        self._touches = TouchLog()
        # The last-used stamp (whole seconds) written per image, kept for the latest
        # second only: a start in that same second finds its record saying so already.
        self._stamped: dict[str, str] = {}
        self._stamp_lock = threading.Lock()
        self.last_result: GcResult | None = None

    @property
    def exhausted_until(self) -> datetime | None:
        """Automatic passes are skipped until then (restore it from node status on start)."""
        return self._exhausted_until

    # ------------------------------------------------------------ entry points

    def run(self, kind: PassKind, now: datetime | None = None) -> GcResult:
        """Run the pass ``kind`` now, whatever the backoff (an operator asked for it)."""
        if kind not in ("watermark", "forced"):
            raise ValueError(f"unknown pass kind {kind!r}: expected 'watermark' or 'forced'")
        return self._collect(kind, now or self._clock())

    def run_watermark(self, now: datetime | None = None) -> GcResult:
        return self.run("watermark", now)

    def run_forced(self, now: datetime | None = None) -> GcResult:
        return self.run("forced", now)

    def run_automatic(self, now: datetime | None = None) -> GcResult:
        """The timer's pass: a watermark pass, skipped while the exhausted backoff is armed."""
        return self._collect("watermark", now or self._clock(), automatic=True)

    def touch_image(self, name: str, now: datetime | None = None) -> bool:
        """Record that a sandbox started from ``name`` (its last-used label).

        The label holds whole seconds: a start in the second this collector last
        wrote it for ``name`` writes nothing (a burst of starts of one image writes
        it once a second, not once a start), and is still in the touch log a pass
        asks before each delete. A failure is logged and returns False: a sandbox
        start never fails on it.
        """
        stamp = rfc3339(now or self._clock(), "seconds")
        try:
            with self._touches.touching(name):
                with self._stamp_lock:
                    if self._stamped.get(name) == stamp:
                        return True
                self._runtime.set_image_labels(
                    name, {LAST_USED_LABEL: stamp}, timeout=self._timeout
                )
                with self._stamp_lock:
                    self._stamped = {n: s for n, s in self._stamped.items() if s == stamp}
                    self._stamped[name] = stamp
        except Exception as exc:
            log.warning("image gc: could not mark image %s used: %s", name, exc)
            return False
        return True

    # ------------------------------------------------------------ the pass

    def _collect(self, kind: PassKind, now: datetime, *, automatic: bool = False) -> GcResult:
        if self.disabled:
            self._metrics.passes.labels(kind, GcOutcome.DISABLED.value).inc()
            return GcResult(
                kind,
                GcOutcome.DISABLED,
                now,
                error=f"image collector disabled: {kind} pass not run",
                finished_at=now,
            )
        with self._lock:
            if automatic and gcpolicy.should_skip_automatic(self._exhausted_until, now):
                self._metrics.passes.labels(kind, GcOutcome.SKIPPED.value).inc()
                self._metrics.backoff_active.set(1)
                log.debug("image gc automatic pass skipped until %s", self._exhausted_until)
                return GcResult(
                    kind,
                    GcOutcome.SKIPPED,
                    now,
                    exhausted_until=self._exhausted_until,
                    finished_at=now,
                )
            try:
                result = self._pass(kind, now)
            except _Abort as exc:
                result = GcResult(
                    kind,
                    GcOutcome.ABORTED,
                    now,
                    error=str(exc),
                    exhausted_until=self._exhausted_until,
                    finished_at=self._clock(),
                )
            self._record(result)
            return result

    def _pass(self, kind: PassKind, now: datetime) -> GcResult:
        mark = self._touches.mark()
        # Read before and after the containers: a start that ends between the two
        # reads has its container in the listing or its image in one of the reads.
        starting = set(self._starting())
        try:
            containers = self._runtime.list_containers(timeout=self._timeout)
        except Exception as exc:
            raise _Abort(f"{kind} pass aborted: cannot list containers: {exc}") from exc
        try:
            records = self._runtime.list_images(timeout=self._timeout)
        except Exception as exc:
            raise _Abort(f"{kind} pass aborted: cannot list images: {exc}") from exc
        try:
            before = self._disk_usage()
        except Exception as exc:
            raise _Abort(f"{kind} pass aborted: cannot measure disk usage: {exc}") from exc

        starting |= set(self._starting())
        protected = ProtectedSet(
            in_use_images=frozenset(c.image for c in containers if c.image) | starting,
            pinned=self.pinned,
            live_job_prefixes=self.live_job_prefixes,
        )
        plan = self._plan(kind, records, protected, before, now)

        removed, gone, failures = self._evict(plan, mark)
        errors: list[str] = []
        if removed:
            # One collection for every delete of the pass, before the disk is measured.
            try:
                self._runtime.collect_garbage(timeout=self._timeout)
            except Exception as exc:
                errors.append(
                    f"removed {len(removed)} images but containerd's garbage collection "
                    f"failed, so their space may not be free yet: {exc}"
                )
        if failures:
            shown = "; ".join(failures[:_MAX_ERRORS_SHOWN])
            more = len(failures) - _MAX_ERRORS_SHOWN
            errors.append(
                f"failed to delete {len(failures)} of {len(plan.evict)} images: {shown}"
                + (f" (and {more} more)" if more > 0 else "")
            )
        after: DiskUsage | None
        try:
            after = self._disk_usage()
        except Exception as exc:
            after = None
            errors.append(f"cannot measure disk usage after the deletes: {exc}")

        self._touches.forget(mark)
        deleted = set(removed) | set(gone)
        previous = self._exhausted_until
        if after is not None:
            self._exhausted_until = gcpolicy.next_exhausted_until(
                kind,
                plan,
                after,
                self.thresholds,
                now,
                previous,
                records_removed=len(deleted),
            )
        remaining_image_bytes = sum(r.size for r in records if r.name not in deleted)
        return GcResult(
            kind,
            _outcome(plan, removed, errors, previous, self._exhausted_until),
            now,
            records_removed=len(removed),
            removed=tuple(removed),
            bytes_freed=max(0, before.used_bytes - after.used_bytes) if after else 0,
            bytes_to_free=plan.bytes_to_free,
            held_back=dict(plan.held_back),
            non_image_bytes=max(0, after.used_bytes - remaining_image_bytes) if after else 0,
            usage_after=after,
            exhausted_until=self._exhausted_until,
            error="; ".join(errors) or None,
            finished_at=self._clock(),
        )

    def _plan(
        self,
        kind: PassKind,
        records: list[ImageRecord],
        protected: ProtectedSet,
        usage: DiskUsage,
        now: datetime,
    ) -> GcPlan:
        """The policy's plan, with the committed images of sandboxes gone or ended
        first: a filesystem kept for nobody goes whatever the pressure."""
        plan = gcpolicy.plan_pass(kind, records, protected, usage, self.thresholds, now)
        names = [r.name for r in records]
        orphans = set(orphaned_images(names, self._live_uids()))
        orphans |= set(orphaned_snapshot_images(names, self._live_snapshots()))
        if not orphans:
            return plan
        return replace(plan, evict=(*(r for r in records if r.name in orphans), *plan.evict))

    def _evict(self, plan: GcPlan, mark: int) -> tuple[list[str], list[str], list[str]]:
        """Delete the plan's records: (removed, gone meanwhile, failures)."""
        removed: list[str] = []
        gone: list[str] = []
        failures: list[str] = []
        for record in plan.evict:
            if self._touches.since(record.name, mark):
                log.info("image gc: %s kept: a sandbox is starting from it", record.name)
                continue
            try:
                self._runtime.delete_image(record.name, timeout=self._timeout)
            except NotFound:
                gone.append(record.name)  # deleted by someone else meanwhile: not a failure
            except Exception as exc:
                failures.append(f"{record.name}: {exc}")
                continue
            else:
                removed.append(record.name)
            with self._stamp_lock:  # a record of that name pulled again has no label yet
                self._stamped.pop(record.name, None)
        return removed, gone, failures

    def _record(self, result: GcResult) -> None:
        m = self._metrics
        m.passes.labels(result.kind, result.outcome.value).inc()
        m.records_removed.labels(result.kind).inc(result.records_removed)
        m.bytes_freed.labels(result.kind).inc(result.bytes_freed)
        if result.held_back:
            for reason in HoldReason:
                m.held_back.labels(reason.value).set(result.held_back.get(reason, 0))
        if result.usage_after is not None:
            m.disk_usage_ratio.set(result.usage_after.ratio)
        m.backoff_active.set(
            1 if gcpolicy.should_skip_automatic(self._exhausted_until, result.started_at) else 0
        )
        self.last_result = result
        log.log(
            logging.WARNING if result.error else logging.INFO,
            "%s",
            _log_line(result),
        )


def _outcome(
    plan: GcPlan,
    removed: list[str],
    errors: list[str],
    previous: datetime | None,
    exhausted_until: datetime | None,
) -> GcOutcome:
    if errors:
        return GcOutcome.ERROR
    if plan.kind == "watermark" and exhausted_until is not None and exhausted_until != previous:
        return GcOutcome.EXHAUSTED
    return GcOutcome.OK if removed else GcOutcome.NOTHING_TO_DO


def _log_line(r: GcResult) -> str:
    parts = [f"image gc pass kind={r.kind} outcome={r.outcome.value}"]
    if r.outcome is not GcOutcome.ABORTED:
        # Only the watermark pass has a byte budget; a forced pass logging one would say 0.
        if r.kind == "watermark" and r.bytes_to_free is not None:
            parts.append(f"bytes_to_free={r.bytes_to_free}")
        parts.append(f"records_removed={r.records_removed} bytes_freed={r.bytes_freed}")
        held = ",".join(f"{k.value}:{r.held_back.get(k, 0)}" for k in HoldReason)
        parts.append(f"held_back_bytes={held} non_image_bytes={r.non_image_bytes}")
        if r.usage_after is not None:
            parts.append(f"usage_percent={r.usage_after.percent:.1f}")
    if r.exhausted_until is not None:
        parts.append(f"exhausted_until={r.exhausted_until.isoformat()}")
    if r.error:
        parts.append(f"error={r.error!r}")
    return " ".join(parts)


__all__ = [
    "GcOutcome",
    "GcResult",
    "ImageCollector",
    "disk_usage_of",
]
