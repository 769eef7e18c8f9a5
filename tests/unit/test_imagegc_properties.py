"""Properties of the GC planner over random stores: a plan never contains a
protected record, the watermark plan respects min age and stays within what is
evictable, and held-back plus planned bytes account for every record."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sandlot.policy.imagegc import (
    DiskUsage,
    GcThresholds,
    ImageLike,
    ProtectedSet,
    plan_eviction,
    plan_forced,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Rec:
    name: str
    size: int
    created_at: datetime
    updated_at: datetime
    labels: dict[str, str] = field(default_factory=dict)
    target_digest: str = ""


names = st.sampled_from(
    [f"reg.test/app{i}:v{j}" for i in range(6) for j in range(3)] + [f"job-{i}" for i in range(4)]
)


@st.composite
def stores(draw: st.DrawFn) -> tuple[list[Rec], ProtectedSet]:
    picked = draw(st.lists(names, unique=True, max_size=20))
    records = []
    for name in picked:
        age = timedelta(seconds=draw(st.integers(0, 7200)))
        records.append(
            Rec(
                name,
                draw(st.integers(0, 10**9)),
                NOW - age,
                NOW - age,
                target_digest=f"sha256:{abs(hash(name)):x}",
            )
        )
    in_use = frozenset(draw(st.lists(st.sampled_from(picked), max_size=5)) if picked else [])
    pinned = frozenset(draw(st.lists(st.sampled_from(picked), max_size=5)) if picked else [])
    prefixes = tuple(draw(st.lists(st.sampled_from(["job-", "reg.test/app1"]), max_size=2)))
    return records, ProtectedSet(in_use, pinned, prefixes)


def _protected(record: ImageLike, protected: ProtectedSet) -> bool:
    return protected.reason(record) is not None


@settings(max_examples=300, deadline=None)
@given(stores(), st.integers(0, 100), st.booleans())
def test_no_plan_ever_contains_a_protected_record(store, used_percent, forced):
    records, protected = store
    usage = DiskUsage(total_bytes=10**10, used_bytes=10**8 * used_percent)
    thresholds = GcThresholds()
    plan = (
        plan_forced(records, protected, NOW)
        if forced
        else plan_eviction(records, protected, usage, thresholds, NOW)
    )
    for record in plan.evict:
        assert not _protected(record, protected), f"{record.name} is protected"
        assert record.name not in protected.in_use_images
        assert record.name not in protected.pinned
        assert not any(record.name.startswith(p) for p in protected.live_job_prefixes)


@settings(max_examples=300, deadline=None)
@given(stores(), st.integers(0, 100))
def test_watermark_plan_respects_min_age_and_is_a_subset_of_the_forced_plan(store, used_percent):
    records, protected = store
    usage = DiskUsage(total_bytes=10**10, used_bytes=10**8 * used_percent)
    thresholds = GcThresholds()
    watermark = plan_eviction(records, protected, usage, thresholds, NOW)
    forced = plan_forced(records, protected, NOW)
    assert {r.name for r in watermark.evict} <= {r.name for r in forced.evict}
    for record in watermark.evict:
        assert NOW - record.created_at >= thresholds.min_age
    if used_percent < thresholds.high_percent:
        assert watermark.evict == () and watermark.bytes_to_free == 0


@settings(max_examples=200, deadline=None)
@given(stores())
def test_forced_plan_and_held_back_account_for_every_byte(store):
    records, protected = store
    plan = plan_forced(records, protected, NOW)
    held = sum(plan.held_back.values())
    assert held + sum(r.size for r in plan.evict) == sum(r.size for r in records)
