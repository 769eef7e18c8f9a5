"""The image GC plan and its backoff, as pure functions of data and a fixed ``now``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.adapters.runtime import ImageRecord
from sandlot.api.keys import LAST_USED_LABEL
from sandlot.policy.imagegc import (
    DiskUsage,
    GcPlan,
    GcThresholds,
    HoldReason,
    ProtectedSet,
    bytes_to_free,
    classify,
    next_exhausted_until,
    pass_for_request,
    plan_eviction,
    plan_forced,
    plan_pass,
    should_skip_automatic,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30
TH = GcThresholds()
NO_PROTECTION = ProtectedSet()


def img(
    name: str,
    size: int = GIB,
    *,
    age: timedelta = timedelta(hours=1),
    used_ago: timedelta | None = None,
    updated_ago: timedelta | None = None,
    digest: str = "",
) -> ImageRecord:
    created = NOW - age
    labels = {}
    if used_ago is not None:
        labels[LAST_USED_LABEL] = (NOW - used_ago).isoformat()
    updated = NOW - updated_ago if updated_ago is not None else created
    return ImageRecord(
        name=name, size=size, created_at=created, updated_at=updated, labels=labels,
        target_digest=digest,
    )  # fmt: skip


def names(plan: GcPlan) -> list[str]:
    return [r.name for r in plan.evict]


def disk(percent: float, total: int = 100 * GIB) -> DiskUsage:
    return DiskUsage(total_bytes=total, used_bytes=int(total * percent / 100))


UNPRESSURED = disk(50)
PRESSURED = disk(90)


# ---------------------------------------------------------------- ordering


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        (
            [img("new", used_ago=timedelta(minutes=10)), img("old", used_ago=timedelta(days=2))],
            ["old", "new"],
        ),
        (
            # equal last use: the older record goes first
            [
                img("young", age=timedelta(hours=1), used_ago=timedelta(minutes=30)),
                img("elder", age=timedelta(days=3), used_ago=timedelta(minutes=30)),
            ],
            ["elder", "young"],
        ),
        (
            # no label: update time stands in for last use
            [img("touched", updated_ago=timedelta(minutes=5)), img("stale", age=timedelta(days=9))],
            ["stale", "touched"],
        ),
        (
            # a label that is not RFC 3339 falls back instead of refusing the record
            [
                ImageRecord(
                    "garbled",
                    GIB,
                    NOW - timedelta(days=5),
                    NOW - timedelta(days=5),
                    {LAST_USED_LABEL: "yesterday"},
                ),
                img("labelled", used_ago=timedelta(days=1)),
            ],
            ["garbled", "labelled"],
        ),
    ],
    ids=[
        "least_recently_used_first_by_label",
        "ties_broken_by_creation_time",
        "unlabelled_record_falls_back_to_update_time",
        "unparseable_label_falls_back_to_update_time",
    ],
)
def test_forced_plan_evicts_in_lru_order(records: list[ImageRecord], expected: list[str]) -> None:
    assert names(plan_forced(records, NO_PROTECTION, NOW)) == expected


def test_watermark_plan_evicts_lru_first_until_budget_is_covered() -> None:
    records = [
        img("d", used_ago=timedelta(minutes=30)),
        img("c", used_ago=timedelta(hours=1)),
        img("a", 4 * GIB, used_ago=timedelta(days=3)),
        img("b", used_ago=timedelta(days=2)),
    ]
    usage = disk(86)  # 86 of 100 GiB used, low mark 80%: 6 GiB to free
    plan = plan_eviction(records, NO_PROTECTION, usage, TH, NOW)
    assert plan.pressure
    assert plan.bytes_to_free == 6 * GIB
    assert names(plan) == ["a", "b", "c"]  # 4 + 1 + 1 GiB covers it; "d" stays
    assert plan.planned_bytes == 6 * GIB
    assert not plan.exhausts_evictable


def test_watermark_plan_takes_everything_it_may_when_the_budget_is_out_of_reach() -> None:
    records = [img("b", used_ago=timedelta(days=2)), img("a", used_ago=timedelta(days=3))]
    plan = plan_eviction(records, NO_PROTECTION, disk(86), TH, NOW)
    assert names(plan) == ["a", "b"]
    assert plan.planned_bytes < (plan.bytes_to_free or 0)
    assert plan.exhausts_evictable


# ---------------------------------------------------------------- protection


@dataclass(frozen=True)
class VetoCase:
    protected: ProtectedSet
    held_reason: HoldReason
    records: list[ImageRecord] = field(
        default_factory=lambda: [img("app:v1", digest="sha256:aa"), img("free:v1")]
    )


VETO_CASES = {
    "in_use_by_name": VetoCase(
        ProtectedSet(in_use_images=frozenset({"app:v1"})), HoldReason.IN_USE
    ),
    "in_use_by_digest": VetoCase(
        ProtectedSet(in_use_images=frozenset({"app@sha256:aa"})), HoldReason.IN_USE
    ),
    "in_use_by_registry_with_port": VetoCase(
        ProtectedSet(in_use_images=frozenset({"reg:5000/app@sha256:bb"})),
        HoldReason.IN_USE,
        [img("reg:5000/app:v1", digest="sha256:bb"), img("free:v1")],
    ),
    "pinned": VetoCase(ProtectedSet(pinned=frozenset({"app:v1"})), HoldReason.PINNED),
    "live_job_prefix": VetoCase(ProtectedSet(live_job_prefixes=("app:",)), HoldReason.LIVE_JOB),
    "a_suspended_sandboxs_filesystem": VetoCase(
        ProtectedSet(),
        HoldReason.PINNED,
        [img("sandlot.local/suspended/uid-1:latest"), img("free:v1")],
    ),
    "a_snapshot": VetoCase(
        ProtectedSet(),
        HoldReason.PINNED,
        [img("sandlot.local/snapshots/uid-1:latest"), img("free:v1")],
    ),
}


@pytest.mark.parametrize("case", VETO_CASES.values(), ids=VETO_CASES.keys())
@pytest.mark.parametrize("kind", ["forced", "watermark"])
def test_protected_record_is_never_evicted_even_under_force(case: VetoCase, kind: str) -> None:
    plan = plan_pass(kind, case.records, case.protected, PRESSURED, TH, NOW)  # type: ignore[arg-type]
    assert names(plan) == ["free:v1"]
    assert plan.held_back[case.held_reason] == GIB


def test_everything_protected_evicts_nothing_under_force() -> None:
    records = [img("a"), img("b"), img("job-1")]
    protected = ProtectedSet(
        in_use_images=frozenset({"a"}), pinned=frozenset({"b"}), live_job_prefixes=("job-",)
    )
    plan = plan_forced(records, protected, NOW)
    assert plan.evict == ()
    assert plan.held_back == {
        HoldReason.IN_USE: GIB,
        HoldReason.PINNED: GIB,
        HoldReason.LIVE_JOB: GIB,
        HoldReason.TOO_YOUNG: 0,
    }


def test_first_matching_reason_wins_so_bytes_are_counted_once() -> None:
    records = [img("a")]
    protected = ProtectedSet(
        in_use_images=frozenset({"a"}), pinned=frozenset({"a"}), live_job_prefixes=("a",)
    )
    c = classify(records, protected, NOW, TH.min_age)
    assert c.held_back_bytes() == {
        HoldReason.IN_USE: GIB,
        HoldReason.PINNED: 0,
        HoldReason.LIVE_JOB: 0,
        HoldReason.TOO_YOUNG: 0,
    }


# ---------------------------------------------------------------- min age


@pytest.mark.parametrize(
    ("record", "evicted"),
    [
        (img("fresh", age=timedelta(seconds=30)), False),
        (img("ripe", age=timedelta(minutes=2)), True),
        (img("old-but-just-used", age=timedelta(days=1), used_ago=timedelta(seconds=10)), False),
    ],
    ids=["pulled_30s_ago_is_too_young", "exactly_min_age_is_evictable", "recent_use_resets_age"],
)
def test_watermark_pass_respects_min_age(record: ImageRecord, evicted: bool) -> None:
    plan = plan_eviction([record], NO_PROTECTION, PRESSURED, TH, NOW)
    assert (names(plan) == [record.name]) is evicted
    assert (plan.held_back[HoldReason.TOO_YOUNG] == record.size) is (not evicted)


def test_forced_pass_ignores_min_age() -> None:
    plan = plan_forced([img("fresh", age=timedelta(seconds=1))], NO_PROTECTION, NOW)
    assert names(plan) == ["fresh"]
    assert plan.held_back[HoldReason.TOO_YOUNG] == 0


# ---------------------------------------------------------------- sizeless records


def test_watermark_pass_skips_sizeless_records_forced_pass_removes_them() -> None:
    records = [img("empty", size=0, age=timedelta(days=9)), img("real", age=timedelta(days=1))]
    watermark = plan_eviction(records, NO_PROTECTION, PRESSURED, TH, NOW)
    assert names(watermark) == ["real"]
    assert watermark.exhausts_evictable  # the sizeless one would free nothing anyway
    assert names(plan_forced(records, NO_PROTECTION, NOW)) == ["empty", "real"]


# ---------------------------------------------------------------- pressure and budget


def test_forced_plan_evicts_where_the_watermark_plan_is_really_empty() -> None:
    records = [img("a"), img("b")]
    watermark = plan_eviction(records, NO_PROTECTION, UNPRESSURED, TH, NOW)
    # the premise: no pressure, so the watermark policy plans nothing at all
    assert watermark.pressure is False
    assert watermark.bytes_to_free == 0
    assert watermark.evict == ()
    forced = plan_forced(records, NO_PROTECTION, NOW)
    assert names(forced) == ["a", "b"]
    assert forced.bytes_to_free is None


@pytest.mark.parametrize(
    ("usage", "thresholds", "expected"),
    [
        (disk(90), GcThresholds(), 10 * GIB),
        (disk(80), GcThresholds(), 0),
        # percent arm asks 10 GiB, absolute arm (free 10 -> 25 GiB) asks 15 GiB: absolute wins
        (disk(90), GcThresholds(target_free_bytes=25 * GIB), 15 * GIB),
        # percent arm asks 10 GiB, absolute arm 2 GiB: percent wins
        (disk(90), GcThresholds(target_free_bytes=12 * GIB), 10 * GIB),
        # target off: min_free is the absolute goal
        (disk(70), GcThresholds(min_free_bytes=40 * GIB), 10 * GIB),
    ],
    ids=[
        "percent_arm_down_to_low_mark",
        "at_low_mark_nothing_to_free",
        "absolute_arm_larger_wins",
        "percent_arm_larger_wins",
        "min_free_is_the_goal_when_target_is_off",
    ],
)
def test_bytes_to_free_takes_the_larger_arm(
    usage: DiskUsage, thresholds: GcThresholds, expected: int
) -> None:
    assert bytes_to_free(usage, thresholds) == expected


@pytest.mark.parametrize(
    ("usage", "thresholds", "pressure"),
    [
        (disk(84.9), GcThresholds(), False),
        (disk(85), GcThresholds(), True),
        (disk(50), GcThresholds(min_free_bytes=60 * GIB), True),
        (disk(50), GcThresholds(min_free_bytes=50 * GIB), False),
    ],
    ids=["below_high", "at_high", "free_below_min_free", "free_at_min_free"],
)
def test_watermark_plan_runs_only_under_pressure(
    usage: DiskUsage, thresholds: GcThresholds, pressure: bool
) -> None:
    plan = plan_eviction([img("a")], NO_PROTECTION, usage, thresholds, NOW)
    assert plan.pressure is pressure
    assert (names(plan) == ["a"]) is pressure
    if not pressure:
        assert plan.bytes_to_free == 0


def test_forced_plan_reports_pressure_without_using_the_watermark_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(*_: Any, **__: Any) -> GcPlan:
        raise AssertionError("the forced pass computed the watermark plan")

    monkeypatch.setattr("sandlot.policy.imagegc.plan_eviction", boom)
    plan = plan_pass("forced", [img("a")], NO_PROTECTION, PRESSURED, TH, NOW)
    assert plan.kind == "forced"
    assert plan.pressure is True
    assert plan.bytes_to_free is None


@pytest.mark.parametrize(("all_", "kind"), [(True, "forced"), (False, "watermark")], ids=str)
def test_prune_request_flag_selects_the_pass(all_: bool, kind: str) -> None:
    assert pass_for_request(all_) == kind


# ---------------------------------------------------------------- backoff

ARMED = NOW + timedelta(minutes=10)
EXHAUSTED_PLAN = plan_eviction([img("a")], NO_PROTECTION, PRESSURED, TH, NOW)
NOT_EXHAUSTED_PLAN = plan_eviction(
    [img(f"i{i}", 5 * GIB) for i in range(5)], NO_PROTECTION, PRESSURED, TH, NOW
)
FORCED_ONE = plan_forced([img("a")], NO_PROTECTION, NOW)
FORCED_NONE = plan_forced([img("a")], ProtectedSet(pinned=frozenset({"a"})), NOW)


@pytest.mark.parametrize(
    ("kind", "plan", "after", "current", "removed", "expected"),
    [
        ("watermark", EXHAUSTED_PLAN, disk(89), None, None, NOW + TH.exhausted_backoff),
        ("watermark", EXHAUSTED_PLAN, disk(79), None, None, None),
        ("watermark", EXHAUSTED_PLAN, disk(89), None, 0, None),
        ("watermark", NOT_EXHAUSTED_PLAN, disk(89), None, None, None),
        ("watermark", EXHAUSTED_PLAN, disk(79), ARMED, None, None),
        ("forced", FORCED_ONE, disk(95), None, None, None),
        ("forced", FORCED_ONE, disk(95), ARMED, None, None),
        ("forced", FORCED_NONE, disk(50), ARMED, None, None),
        ("forced", FORCED_NONE, disk(95), ARMED, None, ARMED),
        ("forced", FORCED_ONE, disk(95), ARMED, 0, ARMED),
    ],
    ids=[
        "watermark_arms_when_nothing_left_and_still_over_high",
        "watermark_does_not_arm_once_below_high",
        "watermark_does_not_arm_when_a_delete_failed",
        "watermark_does_not_arm_while_records_remain",
        "watermark_clears_when_disk_is_back_under",
        "forced_never_arms",
        "forced_clears_armed_backoff_when_it_freed_records",
        "forced_clears_armed_backoff_when_usage_below_high",
        "forced_leaves_armed_backoff_when_it_removed_nothing_and_still_over",
        "forced_leaves_armed_backoff_when_every_delete_failed",
    ],
)
def test_next_exhausted_until(
    kind: str,
    plan: GcPlan,
    after: DiskUsage,
    current: datetime | None,
    removed: int | None,
    expected: datetime | None,
) -> None:
    got = next_exhausted_until(
        kind,  # type: ignore[arg-type]
        plan,
        after,
        TH,
        NOW,
        current,
        records_removed=removed,
    )
    assert got == expected


def test_premise_of_backoff_table() -> None:
    assert EXHAUSTED_PLAN.exhausts_evictable and EXHAUSTED_PLAN.pressure
    assert not NOT_EXHAUSTED_PLAN.exhausts_evictable
    assert FORCED_NONE.evict == ()


def test_watermark_does_not_arm_while_young_records_will_soon_be_evictable() -> None:
    plan = plan_eviction(
        [img("old"), img("young", age=timedelta(seconds=5))], NO_PROTECTION, PRESSURED, TH, NOW
    )
    assert names(plan) == ["old"]
    assert not plan.exhausts_evictable
    assert next_exhausted_until("watermark", plan, disk(89), TH, NOW, None) is None


@pytest.mark.parametrize(
    ("until", "skip"),
    [(None, False), (NOW + timedelta(seconds=1), True), (NOW, False), (NOW - timedelta(1), False)],
    ids=["not_armed", "armed", "expires_now", "expired"],
)
def test_should_skip_automatic(until: datetime | None, skip: bool) -> None:
    assert should_skip_automatic(until, NOW) is skip


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"high_percent": 0}, "high_percent must be in (0, 100]"),
        ({"high_percent": 101}, "high_percent must be in (0, 100]"),
        ({"low_percent": -1}, "low_percent must be in (0, 100]"),
        ({"low_percent": 85, "high_percent": 85}, "low_percent (85) must be below high_percent"),
        ({"min_free_bytes": -1}, "min_free_bytes must be >= 0"),
        ({"min_free_bytes": 10, "target_free_bytes": 5}, "target_free_bytes (5) must be >= min"),
        ({"min_age": timedelta(seconds=-1)}, "min_age must be >= 0"),
        ({"interval": timedelta(0)}, "interval must be > 0"),
        ({"exhausted_backoff": timedelta(0)}, "exhausted_backoff must be > 0"),
    ],
    ids=[
        "high_zero",
        "high_over_100",
        "low_negative",
        "low_not_below_high",
        "min_free_negative",
        "target_below_min_free",
        "min_age_negative",
        "interval_zero",
        "backoff_zero",
    ],
)
def test_thresholds_refuse_bad_values_naming_the_field(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        GcThresholds(**kwargs)
    assert message in str(err.value)


def test_thresholds_defaults() -> None:
    t = GcThresholds()
    assert (t.high_percent, t.low_percent, t.min_free_bytes, t.target_free_bytes) == (85, 80, 0, 0)
    assert (t.min_age, t.interval, t.exhausted_backoff) == (
        timedelta(minutes=2),
        timedelta(seconds=60),
        timedelta(minutes=30),
    )
    assert GcThresholds(min_free_bytes=10).effective_target_free_bytes == 10


@pytest.mark.parametrize(
    ("total", "used", "message"),
    [(0, 0, "total_bytes must be > 0"), (10, 11, "used_bytes must be in [0, total_bytes=10]")],
    ids=["zero_total", "used_over_total"],
)
def test_disk_usage_refuses_impossible_values(total: int, used: int, message: str) -> None:
    with pytest.raises(ValueError) as err:
        DiskUsage(total, used)
    assert message in str(err.value)
