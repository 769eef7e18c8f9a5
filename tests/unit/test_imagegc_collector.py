"""The image collector's control flow against an in-memory ``Runtime`` and disk."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandlot.adapters.runtime import ContainerInfo, ImageRecord, NotFound, RuntimeError_
from sandlot.agent.imagegc import GcOutcome, ImageCollector, disk_usage_of
from sandlot.agent.metrics import GcMetrics
from sandlot.api.keys import LAST_USED_LABEL
from sandlot.policy.imagegc import DiskUsage, GcThresholds, HoldReason

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30
TOTAL = 100 * GIB


class FakeRuntime:
    """The image and container half of the ``Runtime`` protocol, in memory.

    As in containerd, a delete removes the record while its bytes stay on disk
    (``uncollected``) until ``collect_garbage``.
    """

    def __init__(self, images: list[ImageRecord], containers: list[ContainerInfo]) -> None:
        self.images = {i.name: i for i in images}
        self.containers = containers
        self.deleted: list[str] = []
        self.uncollected = 0
        self.collections = 0
        self.fail_collect: Exception | None = None
        self.fail_list_containers: Exception | None = None
        self.fail_delete: dict[str, Exception] = {}
        self.timeouts: list[float] = []

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        self.timeouts.append(timeout)
        if self.fail_list_containers:
            raise self.fail_list_containers
        return list(self.containers)

    def list_images(self, *, timeout: float) -> list[ImageRecord]:
        self.timeouts.append(timeout)
        return list(self.images.values())

    def delete_image(self, name: str, *, timeout: float) -> None:
        self.timeouts.append(timeout)
        if name in self.fail_delete:
            raise self.fail_delete[name]
        if name not in self.images:
            raise NotFound(name)
        self.uncollected += self.images.pop(name).size
        self.deleted.append(name)

    def collect_garbage(self, *, timeout: float) -> None:
        self.timeouts.append(timeout)
        self.collections += 1
        if self.fail_collect:
            raise self.fail_collect
        self.uncollected = 0

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        if name not in self.images:
            raise NotFound(name)
        image = self.images[name]
        self.images[name] = replace(image, labels={**image.labels, **labels})

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the collector must not call Runtime.{name}")


class FakeDisk:
    """A filesystem whose usage is a fixed non-image part plus the images still stored."""

    def __init__(self, runtime: FakeRuntime, non_image: int) -> None:
        self.runtime = runtime
        self.non_image = non_image
        self.calls = 0

    def __call__(self) -> DiskUsage:
        self.calls += 1
        used = self.non_image + self.runtime.uncollected
        used += sum(i.size for i in self.runtime.images.values())
        return DiskUsage(TOTAL, used)


def img(name: str, size: int = GIB, age: timedelta = timedelta(hours=1)) -> ImageRecord:
    return ImageRecord(name=name, size=size, created_at=NOW - age, updated_at=NOW - age)


def store() -> FakeRuntime:
    return FakeRuntime(
        images=[
            img("app:running"),
            img("agent:pinned"),
            img("job-42:live"),
            img("old:a", age=timedelta(days=3)),
            img("old:b", age=timedelta(days=2)),
            img("fresh:c", age=timedelta(seconds=5)),
        ],
        containers=[
            ContainerInfo(id="sb-1", image="app:running"),
            ContainerInfo(id="stopped-but-existing", image="old:never-listed"),
        ],
    )


UNPROTECTED = {"old:a", "old:b", "fresh:c"}


def collector(
    runtime: FakeRuntime,
    non_image: int,
    *,
    registry: CollectorRegistry | None = None,
    **kwargs: Any,
) -> tuple[ImageCollector, FakeDisk]:
    disk = FakeDisk(runtime, non_image)
    c = ImageCollector(
        runtime,
        disk,
        kwargs.pop("thresholds", GcThresholds()),
        pinned=["agent:pinned"],
        live_job_prefixes=["job-"],
        clock=lambda: NOW,
        call_timeout=3.0,
        metrics=GcMetrics(registry or CollectorRegistry()),
        **kwargs,
    )
    return c, disk


UNPRESSURED = 40 * GIB  # 46 of 100 GiB used with the six images
PRESSURED = 88 * GIB  # 94 of 100 GiB used; only 3 GiB evictable, so it cannot get below 85


def test_forced_pass_on_unpressured_disk_removes_every_unprotected_image() -> None:
    runtime = store()
    c, disk = collector(runtime, UNPRESSURED)
    result = c.run_forced(NOW)
    assert result.kind == "forced"
    assert result.outcome is GcOutcome.OK
    assert result.bytes_to_free is None  # no byte budget: nothing to stop it early
    assert set(runtime.deleted) == UNPROTECTED
    assert set(runtime.images) == {"app:running", "agent:pinned", "job-42:live"}
    assert result.records_removed == 3
    assert result.bytes_freed == 3 * GIB  # measured: the fake disk shrank by that much
    assert disk.calls == 2  # before and after the deletes
    assert result.held_back == {
        HoldReason.IN_USE: GIB,
        HoldReason.PINNED: GIB,
        HoldReason.LIVE_JOB: GIB,
        HoldReason.TOO_YOUNG: 0,
    }
    assert result.non_image_bytes == UNPRESSURED
    assert result.error is None
    assert set(runtime.timeouts) == {3.0}


def test_watermark_pass_on_the_same_disk_removes_nothing_and_says_watermark() -> None:
    runtime = store()
    c, _ = collector(runtime, UNPRESSURED)
    result = c.run_watermark(NOW)
    assert result.kind == "watermark"
    assert result.outcome is GcOutcome.NOTHING_TO_DO
    assert runtime.deleted == []
    assert result.bytes_to_free == 0
    assert result.to_prune_result().pass_kind == "watermark"


def test_watermark_pass_under_pressure_evicts_old_unprotected_images_lru_first() -> None:
    runtime = store()
    c, _ = collector(runtime, 80 * GIB)  # 86% used: 6 GiB to free, 2 GiB old enough
    result = c.run_watermark(NOW)
    assert runtime.deleted == ["old:a", "old:b"]  # fresh:c is too young
    assert result.held_back[HoldReason.TOO_YOUNG] == GIB


@pytest.mark.parametrize(
    "failure",
    [RuntimeError_("containerd unavailable"), TimeoutError("deadline")],
    ids=["runtime_error", "timeout"],
)
@pytest.mark.parametrize("kind", ["forced", "watermark"])
def test_container_listing_failure_aborts_with_nothing_deleted(
    failure: Exception, kind: str
) -> None:
    runtime = store()
    runtime.fail_list_containers = failure
    c, _ = collector(runtime, PRESSURED)
    result = c.run(kind, NOW)  # type: ignore[arg-type]
    assert result.outcome is GcOutcome.ABORTED
    assert runtime.deleted == []
    assert result.error is not None and "cannot list containers" in result.error
    assert result.to_prune_result().error == result.error


def test_one_failed_delete_is_recorded_and_the_pass_goes_on() -> None:
    runtime = store()
    runtime.fail_delete["old:a"] = RuntimeError_("content busy")
    c, _ = collector(runtime, UNPRESSURED)
    result = c.run_forced(NOW)
    assert set(runtime.deleted) == {"old:b", "fresh:c"}
    assert result.outcome is GcOutcome.ERROR
    assert result.error is not None and "old:a: content busy" in result.error
    assert result.records_removed == 2


def test_pass_collects_garbage_once_after_its_deletes_so_the_freed_bytes_are_measured() -> None:
    runtime = store()
    c, _ = collector(runtime, UNPRESSURED)
    result = c.run_forced(NOW)
    assert runtime.collections == 1
    assert runtime.uncollected == 0
    assert result.bytes_freed == 3 * GIB and result.error is None


def test_pass_that_removed_nothing_asks_for_no_collection() -> None:
    runtime = FakeRuntime([img("agent:pinned")], [])
    c, _ = collector(runtime, UNPRESSURED)
    result = c.run_forced(NOW)
    assert result.outcome is GcOutcome.NOTHING_TO_DO
    assert runtime.collections == 0


def test_failed_collection_is_an_error_and_bytes_freed_stay_what_the_disk_shows() -> None:
    runtime = store()
    runtime.fail_collect = RuntimeError_("Leases.Delete: no answer within 3s")
    c, _ = collector(runtime, UNPRESSURED)
    result = c.run_forced(NOW)
    assert set(runtime.deleted) == UNPROTECTED and result.records_removed == 3
    assert result.outcome is GcOutcome.ERROR
    assert result.error is not None and "garbage collection failed" in result.error
    assert "no answer within 3s" in result.error
    assert result.bytes_freed == 0  # the records are gone, their bytes are not yet


def test_image_already_gone_is_not_a_failure() -> None:
    runtime = store()
    runtime.fail_delete["old:a"] = NotFound("old:a")
    c, _ = collector(runtime, UNPRESSURED)
    result = c.run_forced(NOW)
    assert result.error is None
    assert result.records_removed == 2


def test_automatic_pass_arms_backoff_and_the_next_one_is_skipped() -> None:
    runtime = store()
    c, _ = collector(runtime, PRESSURED, thresholds=GcThresholds(min_age=timedelta(0)))
    first = c.run_automatic(NOW)
    assert first.outcome is GcOutcome.EXHAUSTED
    assert set(runtime.deleted) == UNPROTECTED
    assert first.exhausted_until == NOW + timedelta(minutes=30)
    assert first.usage_after is not None and first.usage_after.percent >= 85

    runtime.images["late:arrival"] = img("late:arrival", age=timedelta(days=1))
    second = c.run_automatic(NOW + timedelta(minutes=29))
    assert second.outcome is GcOutcome.SKIPPED
    assert not second.ran
    assert "late:arrival" in runtime.images

    third = c.run_automatic(NOW + timedelta(minutes=30))
    assert third.outcome is not GcOutcome.SKIPPED
    assert "late:arrival" not in runtime.images


def test_forced_pass_clears_armed_backoff_when_it_freed_records() -> None:
    runtime = store()
    armed = NOW + timedelta(minutes=20)
    c, _ = collector(runtime, PRESSURED, exhausted_until=armed)
    assert c.run_automatic(NOW).outcome is GcOutcome.SKIPPED
    result = c.run_forced(NOW)
    assert result.records_removed == 3
    assert result.usage_after is not None and result.usage_after.percent >= 85  # still over
    assert result.exhausted_until is None
    assert c.exhausted_until is None
    assert c.run_automatic(NOW).outcome is not GcOutcome.SKIPPED


def test_forced_pass_leaves_armed_backoff_when_it_removed_nothing_and_disk_still_over() -> None:
    runtime = FakeRuntime([img("agent:pinned")], [])
    armed = NOW + timedelta(minutes=20)
    c, _ = collector(runtime, PRESSURED, exhausted_until=armed)
    result = c.run_forced(NOW)
    assert result.outcome is GcOutcome.NOTHING_TO_DO
    assert c.exhausted_until == armed


def test_forced_pass_never_arms_backoff() -> None:
    runtime = store()
    c, _ = collector(runtime, PRESSURED)
    result = c.run_forced(NOW)
    assert result.usage_after is not None and result.usage_after.percent >= 85
    assert result.exhausted_until is None
    assert result.outcome is GcOutcome.OK


def test_forced_pass_does_not_compute_the_watermark_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise AssertionError("forced pass computed the watermark plan")

    monkeypatch.setattr("sandlot.policy.imagegc.plan_eviction", boom)
    runtime = store()
    c, _ = collector(runtime, PRESSURED)
    assert c.run_forced(NOW).records_removed == 3


def test_log_line_has_bytes_to_free_only_on_the_watermark_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sandlot.agent.imagegc")
    c, _ = collector(store(), PRESSURED)
    c.run_forced(NOW)
    forced_lines = [r.getMessage() for r in caplog.records]
    caplog.clear()
    c.run_watermark(NOW)
    watermark_lines = [r.getMessage() for r in caplog.records]

    assert len(forced_lines) == 1 and "kind=forced" in forced_lines[0]
    assert "bytes_to_free" not in forced_lines[0]
    assert len(watermark_lines) == 1 and "kind=watermark" in watermark_lines[0]
    assert "bytes_to_free=" in watermark_lines[0]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("run_forced", "image collector disabled: forced pass not run"),
        ("run_watermark", "image collector disabled: watermark pass not run"),
        ("run_automatic", "image collector disabled: watermark pass not run"),
    ],
    ids=["forced", "watermark", "automatic"],
)
def test_disabled_collector_error_names_the_pass(entry: str, expected: str) -> None:
    runtime = store()
    c, _ = collector(runtime, PRESSURED, disabled=True)
    result = getattr(c, entry)(NOW)
    assert result.error == expected
    assert result.outcome is GcOutcome.DISABLED
    assert runtime.deleted == []
    assert result.to_prune_result().error == expected


def test_prune_result_and_node_status_carry_the_pass() -> None:
    c, _ = collector(store(), UNPRESSURED)
    result = c.run("forced", NOW)
    prune = result.to_prune_result()
    assert prune.wire()["pass"] == "forced"
    assert (prune.records_removed, prune.bytes_freed) == (3, 3 * GIB)
    assert prune.held_back.in_use == GIB
    assert prune.completed_at == NOW
    status = result.to_node_gc_status()
    assert (status.last_pass_kind, status.last_pass_outcome) == ("forced", "ok")
    assert status.non_image_bytes == UNPRESSURED


def test_metrics_count_passes_and_bytes() -> None:
    registry = CollectorRegistry()
    runtime = store()
    c, _ = collector(runtime, PRESSURED, registry=registry, thresholds=GcThresholds())
    c.run_forced(NOW)
    c.run_watermark(NOW)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("sandlot_agent_gc_passes_total", kind="forced", outcome="ok") == 1
    assert value("sandlot_agent_gc_records_removed_total", kind="forced") == 3
    assert value("sandlot_agent_gc_bytes_freed_total", kind="forced") == 3 * GIB
    assert value("sandlot_agent_gc_passes_total", kind="watermark", outcome="exhausted") == 1
    assert value("sandlot_agent_gc_backoff_active") == 1
    assert value("sandlot_agent_gc_held_back_bytes", reason="pinned") == GIB
    ratio = value("sandlot_agent_disk_usage_ratio")
    assert ratio is not None and 0.85 < ratio < 1


def test_touch_image_sets_the_last_used_label() -> None:
    runtime = store()
    c, _ = collector(runtime, UNPRESSURED)
    assert c.touch_image("old:a", NOW)
    assert runtime.images["old:a"].labels[LAST_USED_LABEL] == "2026-05-01T12:00:00Z"
    assert not c.touch_image("missing:x", NOW)  # logged, never raised into a sandbox start


def test_touched_image_is_no_longer_first_to_go() -> None:
    runtime = FakeRuntime(
        [img("old:a", age=timedelta(days=3)), img("old:b", age=timedelta(days=2))], []
    )
    c, _ = collector(runtime, 84 * GIB)  # 86% used: 6 GiB to free; both go, in LRU order
    c.touch_image("old:a", NOW - timedelta(hours=1))
    c.run_watermark(NOW)
    assert runtime.deleted == ["old:b", "old:a"]


@pytest.mark.parametrize(
    ("live", "deleted"),
    [
        (None, []),
        (frozenset({"uid-kept", "uid-gone"}), []),
        (frozenset({"uid-kept"}), ["sandlot.local/snapshots/uid-gone:latest"]),
    ],
    ids=["snapshots-not-listed-yet", "both-live", "one-deleted"],
)
def test_a_snapshots_image_goes_only_with_its_object(
    live: frozenset[str] | None, deleted: list[str]
) -> None:
    runtime = store()
    for uid in ("uid-kept", "uid-gone"):
        name = f"sandlot.local/snapshots/{uid}:latest"
        runtime.images[name] = img(name, age=timedelta(days=30))
    c, _ = collector(runtime, UNPRESSURED, live_snapshots=lambda: live)
    c.run_watermark(NOW)  # no pressure: only an orphan goes
    assert runtime.deleted == deleted
    c.run_forced(NOW)  # a forced pass never takes a live one
    assert "sandlot.local/snapshots/uid-kept:latest" in runtime.images


def test_disk_usage_of_measures_a_real_filesystem(tmp_path: Any) -> None:
    usage = disk_usage_of(str(tmp_path))
    assert usage.total_bytes > 0
    assert 0 <= usage.used_bytes <= usage.total_bytes


@pytest.mark.parametrize(
    ("live", "deleted"),
    [
        (None, []),
        (frozenset({"uid-kept", "uid-gone"}), []),
        (frozenset({"uid-kept"}), ["sandlot.local/suspended/uid-gone:latest"]),
    ],
    ids=["sandboxes-not-listed-yet", "both-live", "one-deleted-or-ended"],
)
def test_a_suspended_sandboxs_image_goes_only_with_its_sandbox(
    live: frozenset[str] | None, deleted: list[str]
) -> None:
    runtime = store()
    for uid in ("uid-kept", "uid-gone"):
        name = f"sandlot.local/suspended/{uid}:latest"
        runtime.images[name] = img(name, age=timedelta(days=30))
    c, _ = collector(runtime, UNPRESSURED, live_uids=lambda: live)
    c.run_watermark(NOW)  # no pressure: only an orphan goes
    assert runtime.deleted == deleted
    c.run_forced(NOW)  # a forced pass never takes a live one
    assert "sandlot.local/suspended/uid-kept:latest" in runtime.images
