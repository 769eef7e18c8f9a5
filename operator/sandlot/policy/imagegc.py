"""Image garbage collection as pure decisions: which records a pass evicts, and
whether automatic passes should back off.

Every function here is a function of (records, protected set, usage, thresholds,
now) and nothing else, so the agent's collector computes a plan once per pass and
tests can pin down the policy without a runtime or a clock.

Two passes share one protection filter (``classify``), so the forced pass forces
the *policy*, never the safety: images backing containers, pinned images and
live-job records are an absolute veto in both.

- The **watermark** pass runs under disk pressure only and evicts least recently
  used records older than ``min_age`` until a byte budget is covered.
- The **forced** pass (an operator's ``cache clear containerd --all``) evicts every
  unprotected record, pressure or not. It has no byte budget (``bytes_to_free`` is
  ``None``), never arms the exhausted backoff, and clears an armed one once it has
  disproved its premise.

Sizeless records (size 0, typically content the store cannot account for) free
nothing and cost nothing to keep, so the watermark pass never spends a deletion on
them; the forced pass removes them like any other unprotected record, because
"clear" means clear.

``records`` only need the attributes of ``sandlot.adapters.runtime.ImageRecord``
(see ``ImageLike``); this layer does not import the adapter that defines it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal, Protocol

from sandlot.api.keys import LAST_USED_LABEL
from sandlot.policy.snapshots import is_snapshot_image
from sandlot.policy.suspension import is_suspended_image

PassKind = Literal["watermark", "forced"]


class ImageLike(Protocol):
    """What the policy reads of an image record."""

    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def updated_at(self) -> datetime | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def target_digest(self) -> str: ...


class HoldReason(StrEnum):
    """Why a record was kept. Checked in this order; the first that applies wins."""

    IN_USE = "in_use"
    PINNED = "pinned"
    LIVE_JOB = "live_job"
    TOO_YOUNG = "too_young"


@dataclass(frozen=True)
class GcThresholds:
    """When the watermark pass runs, how far it goes, and how long it backs off.

    Validated at construction; a bad value raises ``ValueError`` naming the field.
    """

    high_percent: float = 85.0
    """Disk usage (percent of the filesystem) at or above which the watermark pass evicts."""
    low_percent: float = 80.0
    """Disk usage (percent) the watermark pass evicts down to."""
    min_free_bytes: int = 0
    """Free bytes below which the watermark pass evicts regardless of percent; 0 = off."""
    target_free_bytes: int = 0
    """Free bytes the watermark pass evicts up to; 0 = off (then ``min_free_bytes`` is the
    target of the absolute arm)."""
    min_age: timedelta = timedelta(minutes=2)
    """A record younger than this (since pull or last use) is never evicted by the watermark
    pass: it protects an image pulled or touched for a sandbox whose container is not
    created yet."""
    interval: timedelta = timedelta(seconds=60)
    """Time between automatic passes."""
    exhausted_backoff: timedelta = timedelta(minutes=30)
    """How long automatic passes are skipped once one found nothing left to evict and the
    disk still over the line."""

    def __post_init__(self) -> None:
        for name in ("high_percent", "low_percent"):
            value = getattr(self, name)
            if not (0 < value <= 100):
                raise ValueError(f"{name} must be in (0, 100], got {value}")
        if self.low_percent >= self.high_percent:
            raise ValueError(
                f"low_percent ({self.low_percent}) must be below high_percent ({self.high_percent})"
            )
        for name in ("min_free_bytes", "target_free_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.target_free_bytes and self.target_free_bytes < self.min_free_bytes:
            raise ValueError(
                f"target_free_bytes ({self.target_free_bytes}) must be >= min_free_bytes "
                f"({self.min_free_bytes}) or 0 (off)"
            )
        if self.min_age < timedelta(0):
            raise ValueError(f"min_age must be >= 0, got {self.min_age}")
        for name in ("interval", "exhausted_backoff"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def effective_target_free_bytes(self) -> int:
        """Free-space goal of the absolute arm: ``target_free_bytes``, else ``min_free_bytes``."""
        return self.target_free_bytes or self.min_free_bytes


@dataclass(frozen=True)
class DiskUsage:
    """Usage of the filesystem holding containerd's root, in bytes.

    ``used_bytes`` counts everything not available to the runtime (blocks reserved
    for root included), as kubelet does, so ``free`` is what can really be written.
    """

    total_bytes: int
    used_bytes: int

    def __post_init__(self) -> None:
        if self.total_bytes <= 0:
            raise ValueError(f"total_bytes must be > 0, got {self.total_bytes}")
        if not (0 <= self.used_bytes <= self.total_bytes):
            raise ValueError(
                f"used_bytes must be in [0, total_bytes={self.total_bytes}], got {self.used_bytes}"
            )

    @property
    def free(self) -> int:
        return self.total_bytes - self.used_bytes

    @property
    def percent(self) -> float:
        return 100.0 * self.used_bytes / self.total_bytes

    @property
    def ratio(self) -> float:
        return self.used_bytes / self.total_bytes


def under_pressure(usage: DiskUsage, thresholds: GcThresholds) -> bool:
    """The watermark pass's trigger: usage >= high, or free below ``min_free_bytes``."""
    return usage.percent >= thresholds.high_percent or (
        thresholds.min_free_bytes > 0 and usage.free < thresholds.min_free_bytes
    )


@dataclass(frozen=True)
class ProtectedSet:
    """Records no pass may evict.

    Image names and target digests both match, so a container created from
    ``name@sha256:...`` still protects its record.
    """

    in_use_images: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()
    live_job_prefixes: tuple[str, ...] = ()

    def reason(self, record: ImageLike) -> HoldReason | None:
        keys = {record.name}
        if record.target_digest:
            bare = record.name.split("@", 1)[0]
            keys |= {
                record.target_digest,
                f"{bare}@{record.target_digest}",
                f"{_repository(bare)}@{record.target_digest}",
            }
        if keys & self.in_use_images:
            return HoldReason.IN_USE
        if keys & self.pinned or is_suspended_image(record.name) or is_snapshot_image(record.name):
            # A suspended sandbox's filesystem is its state; a snapshot goes with its object.
            return HoldReason.PINNED
        if any(record.name.startswith(p) for p in self.live_job_prefixes if p):
            return HoldReason.LIVE_JOB
        return None


def _repository(reference: str) -> str:
    """``registry:5000/app:v1`` -> ``registry:5000/app`` (a tag follows the last slash)."""
    head, _, tail = reference.rpartition("/")
    repo_tail = tail.split(":", 1)[0]
    return f"{head}/{repo_tail}" if head else repo_tail


def last_used(record: ImageLike) -> datetime:
    """The record's last-used time: its label, else its update time, else its creation."""
    raw = record.labels.get(LAST_USED_LABEL)
    if raw:
        try:
            return _aware(datetime.fromisoformat(raw))
        except ValueError:
            pass  # a hand-edited or foreign label: fall back rather than refuse the record
    return _aware(record.updated_at or record.created_at)


def lru_key(record: ImageLike) -> tuple[datetime, datetime, str]:
    """Least recently used first; ties by creation time, then name (deterministic)."""
    return (last_used(record), _aware(record.created_at), record.name)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Classification:
    """Records sorted by one filter: evictable (LRU order) or held back by reason."""

    evictable: tuple[ImageLike, ...]
    held_back: Mapping[HoldReason, tuple[ImageLike, ...]]

    def held_back_bytes(self) -> dict[HoldReason, int]:
        return {r: sum(x.size for x in self.held_back.get(r, ())) for r in HoldReason}


def classify(
    records: Iterable[ImageLike],
    protected: ProtectedSet,
    now: datetime,
    min_age: timedelta | None,
) -> Classification:
    """Sort records into evictable (least recently used first) and held back.

    ``min_age=None`` skips the age check (forced pass); the protected set always applies.
    A record's age counts from the later of its creation and its last use.
    """
    held: dict[HoldReason, list[ImageLike]] = {r: [] for r in HoldReason}
    evictable: list[ImageLike] = []
    for record in records:
        reason = protected.reason(record)
        if reason is None and min_age is not None:
            newest = max(_aware(record.created_at), last_used(record))
            if now - newest < min_age:
                reason = HoldReason.TOO_YOUNG
        if reason is None:
            evictable.append(record)
        else:
            held[reason].append(record)
    evictable.sort(key=lru_key)
    return Classification(
        evictable=tuple(evictable),
        held_back={r: tuple(v) for r, v in held.items()},
    )


@dataclass(frozen=True)
class GcPlan:
    """What one pass will delete, in order, and why the rest stays."""

    kind: PassKind
    evict: tuple[ImageLike, ...]
    bytes_to_free: int | None
    """The watermark pass's byte budget; ``None`` for the forced pass, which has none."""
    held_back: Mapping[HoldReason, int]
    """Bytes kept, by reason."""
    pressure: bool
    """The disk was over the watermark (or under ``min_free_bytes``) when planned."""
    exhausts_evictable: bool = False
    """The watermark plan takes every record it may take and nothing is merely too young:
    if usage is still over the line after it, the store cannot be shrunk further."""

    @property
    def planned_bytes(self) -> int:
        return sum(r.size for r in self.evict)


def bytes_to_free(usage: DiskUsage, thresholds: GcThresholds) -> int:
    """Bytes to free to reach both the low percent and the free-space target.

    Each arm asks for its own amount; the larger one wins.
    """
    target_used = math.floor(usage.total_bytes * thresholds.low_percent / 100)
    by_percent = max(0, usage.used_bytes - target_used)
    by_free = max(0, thresholds.effective_target_free_bytes - usage.free)
    return max(by_percent, by_free)


def plan_eviction(
    records: Iterable[ImageLike],
    protected: ProtectedSet,
    usage: DiskUsage,
    thresholds: GcThresholds,
    now: datetime,
) -> GcPlan:
    """The watermark pass: under pressure only, LRU first, until the budget is covered."""
    classified = classify(records, protected, now, thresholds.min_age)
    held = classified.held_back_bytes()
    if not under_pressure(usage, thresholds):
        return GcPlan("watermark", (), 0, held, pressure=False)
    budget = bytes_to_free(usage, thresholds)
    sized = [r for r in classified.evictable if r.size > 0]
    evict: list[ImageLike] = []
    planned = 0
    for record in sized:
        if planned >= budget:
            break
        evict.append(record)
        planned += record.size
    exhausts = len(evict) == len(sized) and held[HoldReason.TOO_YOUNG] == 0
    return GcPlan(
        "watermark", tuple(evict), budget, held, pressure=True, exhausts_evictable=exhausts
    )


def plan_forced(
    records: Iterable[ImageLike],
    protected: ProtectedSet,
    now: datetime,
) -> GcPlan:
    """The forced pass: every unprotected record, no age limit, no budget, LRU order."""
    classified = classify(records, protected, now, None)
    return GcPlan(
        "forced",
        classified.evictable,
        None,
        classified.held_back_bytes(),
        pressure=False,
    )


def plan_pass(
    kind: PassKind,
    records: Iterable[ImageLike],
    protected: ProtectedSet,
    usage: DiskUsage,
    thresholds: GcThresholds,
    now: datetime,
) -> GcPlan:
    """The one plan of a pass of ``kind``; the forced pass never computes the watermark plan.

    ``pressure`` of a forced plan reports the disk as it was (informational only).
    """
    if kind == "forced":
        forced = plan_forced(records, protected, now)
        return _with_pressure(forced, under_pressure(usage, thresholds))
    return plan_eviction(records, protected, usage, thresholds, now)


def _with_pressure(p: GcPlan, pressure: bool) -> GcPlan:
    return GcPlan(p.kind, p.evict, p.bytes_to_free, p.held_back, pressure, p.exhausts_evictable)


def pass_for_request(all_: bool) -> PassKind:
    """Which pass a CachePrune request runs: ``--all`` forces, otherwise the watermark."""
    return "forced" if all_ else "watermark"


def next_exhausted_until(
    kind: PassKind,
    plan: GcPlan,
    usage_after: DiskUsage,
    thresholds: GcThresholds,
    now: datetime,
    current: datetime | None,
    *,
    records_removed: int | None = None,
) -> datetime | None:
    """The backoff after a pass.

    ``records_removed`` defaults to every planned record; pass the real count when
    some deletes failed (a record that failed to go is still there to evict).

    - watermark: armed (``now + exhausted_backoff``) when the plan took everything it
      could, every delete succeeded and the disk is still over the line; cleared when
      the disk is no longer over the line; else left alone.
    - forced: never arms. An operator's pass evicts a superset of what the automatic
      pass may touch, so if it removed a record or the disk is back under the high
      mark, the premise "nothing left and still over" is disproved: cleared. Else left
      alone.

    "Over the line" is the watermark trigger (``under_pressure``): with
    ``min_free_bytes`` off it is exactly usage >= high.
    """
    removed = len(plan.evict) if records_removed is None else records_removed
    still_over = under_pressure(usage_after, thresholds)
    if kind == "forced":
        if removed >= 1 or not still_over:
            return None
        return current
    if plan.pressure and plan.exhausts_evictable and removed == len(plan.evict) and still_over:
        return now + thresholds.exhausted_backoff
    if not still_over:
        return None
    return current


def should_skip_automatic(exhausted_until: datetime | None, now: datetime) -> bool:
    """Automatic passes are skipped while the exhausted backoff is armed."""
    return exhausted_until is not None and now < exhausted_until


__all__ = [
    "Classification",
    "DiskUsage",
    "GcPlan",
    "GcThresholds",
    "HoldReason",
    "ImageLike",
    "PassKind",
    "ProtectedSet",
    "bytes_to_free",
    "classify",
    "last_used",
    "lru_key",
    "next_exhausted_until",
    "pass_for_request",
    "plan_eviction",
    "plan_forced",
    "plan_pass",
    "should_skip_automatic",
    "under_pressure",
]
