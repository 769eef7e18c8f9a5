"""The node's disk under pressure (``policy.diskpressure``) and a growing sandbox
measured again before it runs far past its limit (``policy.ephemeralstorage``):
plain data and a fake clock."""

from __future__ import annotations

import pytest

from sandlot.policy.diskpressure import (
    Candidate,
    FsUse,
    decide_pressure,
    fuller,
    pressure_holds,
    rank,
    unmeasured_holds,
)
from sandlot.policy.ephemeralstorage import (
    MIN_CHECK,
    DiskUse,
    Sample,
    decide_storage,
    next_check,
)

MI = 2**20
GI = 2**30

# ------------------------------------------------------------------ the ranking


def test_rank_is_the_kubelets_over_limit_then_over_request_then_largest_above_request() -> None:
    quiet = Candidate("ns/quiet", usage=1 * MI, limit=100 * MI)
    big = Candidate("ns/big", usage=90 * MI, limit=100 * MI)
    over = Candidate("ns/over", usage=20 * MI, limit=10 * MI)
    within_request = Candidate("ns/within", usage=200 * MI, request=300 * MI)
    above_request = Candidate("ns/above", usage=60 * MI, request=50 * MI)
    order = [c.key for c in rank([quiet, within_request, big, above_request, over])]
    # over its limit first; then those over their request by usage above it
    # (big 90, quiet 1, above 10 -> big, above, quiet); within its request last
    assert order == ["ns/over", "ns/big", "ns/above", "ns/quiet", "ns/within"]


def test_rank_breaks_ties_by_key_so_a_pass_is_repeatable() -> None:
    a, b = Candidate("ns/b", usage=5 * MI), Candidate("ns/a", usage=5 * MI)
    assert [c.key for c in rank([a, b])] == ["ns/a", "ns/b"]


# ------------------------------------------------------------------ the decision


@pytest.mark.parametrize(
    ("used_pct", "freeing_mi", "evicted"),
    [
        # under the high watermark (50%): nobody, whatever the sandboxes hold
        (49, 0, []),
        # at it: down to 40% of 1000 MiB means 100 MiB freed: the largest writer
        # (300) alone is enough
        (50, 0, ["ns/w1"]),
        # at 80%: 400 MiB to free: both writers (300 + 200)
        (80, 0, ["ns/w1", "ns/w2"]),
        # at 80% with 350 MiB already being freed by stops in flight: 50 more,
        # one writer, never the quiet one
        (80, 350, ["ns/w1"]),
        # everything being freed already: nobody more
        (80, 400, []),
        # more than the writers hold: the quiet one too
        (95, 0, ["ns/w1", "ns/w2", "ns/quiet"]),
    ],
)
def test_decide_pressure_evicts_in_rank_order_down_to_the_low_watermark(
    used_pct: int, freeing_mi: int, evicted: list[str]
) -> None:
    capacity = 1000 * MI
    use = FsUse(used=capacity * used_pct // 100, capacity=capacity)
    candidates = [
        Candidate("ns/quiet", usage=4 * MI, limit=512 * MI),
        Candidate("ns/w2", usage=200 * MI, limit=512 * MI),
        Candidate("ns/w1", usage=300 * MI, limit=512 * MI),
    ]
    d = decide_pressure(use, high=0.5, low=0.4, candidates=candidates, freeing=freeing_mi * MI)
    assert d.pressure is (used_pct >= 50)
    assert [e.key for e in d.evict] == evicted


def test_an_eviction_message_names_the_resource_and_both_usages() -> None:
    d = decide_pressure(
        FsUse(used=600 * MI, capacity=1000 * MI),
        high=0.5,
        low=0.4,
        candidates=[Candidate("ns/w", usage=300 * MI, limit=512 * MI)],
    )
    (e,) = d.evict
    assert "ephemeral-storage" in e.message
    assert "60% full (600.0Mi of 1000.0Mi" in e.message
    assert "used 300.0Mi" in e.message
    assert "limit 512.0Mi" in e.message


def test_a_sandbox_holding_nothing_is_never_evicted() -> None:
    d = decide_pressure(
        FsUse(used=900, capacity=1000),
        high=0.5,
        low=0.4,
        candidates=[Candidate("ns/empty", usage=0)],
    )
    assert d.pressure and d.evict == ()


@pytest.mark.parametrize(("high", "low"), [(0.4, 0.5), (0.0, 0.0), (1.5, 0.4), (0.5, -0.1)])
def test_watermarks_out_of_order_are_refused_naming_both(high: float, low: float) -> None:
    with pytest.raises(ValueError, match=r"low=.*high="):
        decide_pressure(FsUse(1, 2), high=high, low=low, candidates=[])


def test_the_fuller_filesystem_counts() -> None:
    root = FsUse(used=10 * GI, capacity=100 * GI)  # 10%
    logs = FsUse(used=6 * GI, capacity=10 * GI)  # 60%
    assert fuller([root, logs]) is logs
    assert fuller([]).capacity == 0


@pytest.mark.parametrize(
    ("now", "since", "held"),
    # nothing unmeasured; unmeasured since now; within the hold; the hold over
    [(100.0, None, False), (100.0, 100.0, True), (104.9, 100.0, True), (105.0, 100.0, False)],
)
def test_an_unmeasured_sandbox_holds_evictions_back_for_at_most_the_hold(
    now: float, since: float | None, held: bool
) -> None:
    assert unmeasured_holds(now, since, hold=5.0) is held


@pytest.mark.parametrize(
    ("now", "last_over", "held"),
    [(100.0, None, False), (100.0, 100.0, True), (399.0, 100.0, True), (400.0, 100.0, False)],
)
def test_pressure_is_held_for_the_transition_period(
    now: float, last_over: float | None, held: bool
) -> None:
    assert pressure_holds(now, last_over, transition=300.0) is held


# ------------------------------------------------------------------ re-measuring a writer


@pytest.mark.parametrize(
    ("previous", "current", "interval", "wait"),
    [
        (None, Sample(10 * MI, 5.0), 10.0, 10.0),  # first sight: the interval
        (Sample(10 * MI, 0.0), Sample(10 * MI, 5.0), 10.0, 10.0),  # not growing
        (Sample(12 * MI, 0.0), Sample(10 * MI, 5.0), 10.0, 10.0),  # shrinking
        # 1 MiB/s, 100 MiB to go: half of 100 s is past the interval
        (Sample(0, 0.0), Sample(1 * MI, 1.0), 10.0, 10.0),
        # 4 MiB/s, 16 MiB to go: 4 s away, measured in 2
        (Sample(8 * MI, 0.0), Sample(16 * MI, 2.0), 10.0, 2.0),
        # at the limit already: the floor
        (Sample(0, 0.0), Sample(32 * MI, 1.0), 10.0, MIN_CHECK),
    ],
)
def test_next_check(previous: Sample | None, current: Sample, interval: float, wait: float) -> None:
    limit = 101 * MI if current.bytes == 1 * MI else 32 * MI
    assert next_check(previous, current, limit, interval) == pytest.approx(wait)


def test_next_check_refuses_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval must be positive, got 0"):
        next_check(None, Sample(0, 0.0), 1, 0)


def _writer_stopped_at(interval: float, adaptive: bool) -> tuple[int, int]:
    """A sandbox started at t=0 (an empty writable layer: the first sample) writing
    4 MiB/s towards 32 MiB, measured at t=1 and then when its next check is due (a
    fake clock): its use when stopped, and the passes."""
    rate, limit = 4 * MI, 32 * MI
    now, previous, passes = 1.0, Sample(0, 0.0), 0
    while True:
        passes += 1
        current = Sample(int(rate * now), now)
        if decide_storage(DiskUse(bytes=current.bytes, entries=1), limit).stop:
            return current.bytes, passes
        wait = next_check(previous, current, limit, interval) if adaptive else interval
        previous, now = current, now + wait


def test_a_writer_at_4_mib_per_second_is_stopped_shortly_after_32_mib() -> None:
    stopped, passes = _writer_stopped_at(interval=10.0, adaptive=True)
    # past the limit by at most one floor's worth of writing (0.25 s at 4 MiB/s)
    assert 32 * MI < stopped <= 33 * MI, stopped / MI
    assert passes < 12
    # measured only every interval it would have reached 44 MiB
    assert _writer_stopped_at(interval=10.0, adaptive=False)[0] == 44 * MI
