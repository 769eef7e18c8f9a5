"""A start that touches an image while a pass is under way keeps it from that pass's
deletes: the pass planned from the label it listed before the touch."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.adapters.runtime import ContainerInfo, ImageRecord, NotFound
from sandlot.agent.imagegc import ImageCollector
from sandlot.agent.imagetouch import TouchLog
from sandlot.api.keys import LAST_USED_LABEL
from sandlot.api.timestamps import rfc3339
from sandlot.policy.imagegc import DiskUsage, GcThresholds

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30


class Images:
    """The image half of the ``Runtime`` protocol, in memory."""

    def __init__(self, *names: str) -> None:
        old = NOW - timedelta(hours=1)
        self.images = {n: ImageRecord(n, GIB, created_at=old, updated_at=old) for n in names}
        self.deleted: list[str] = []

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        return []

    def list_images(self, *, timeout: float) -> list[ImageRecord]:
        return list(self.images.values())

    def delete_image(self, name: str, *, timeout: float) -> None:
        if self.images.pop(name, None) is None:
            raise NotFound(name)
        self.deleted.append(name)

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        self.images[name] = replace(self.images[name], labels={**labels})

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the collector must not call Runtime.{name}")


@pytest.mark.parametrize(
    ("touched_mid_pass", "deleted"),
    [(True, []), (False, ["base"])],
    ids=["touched-after-listing-is-kept", "untouched-is-collected"],
)
def test_image_touched_after_the_pass_listed_it_is_not_deleted(
    touched_mid_pass: bool, deleted: list[str]
) -> None:
    runtime = Images("base")
    collector: ImageCollector

    def disk() -> DiskUsage:
        # Measured after the listings, before the deletes: a start touches "base" now.
        if touched_mid_pass and not runtime.deleted:
            assert collector.touch_image("base", now=NOW)
        return DiskUsage(100 * GIB, 95 * GIB)

    collector = ImageCollector(
        runtime,
        disk,
        GcThresholds(high_percent=85, low_percent=80),
        clock=lambda: NOW,
        call_timeout=1,
    )
    collector.run_watermark(NOW)
    assert runtime.deleted == deleted


def test_touch_log_vetoes_touches_after_the_mark_and_under_way() -> None:
    log = TouchLog()
    with log.touching("before"):
        pass
    mark = log.mark()
    assert not log.since("before", mark), "a touch done before the pass is its listing's label"
    assert not log.since("never", mark)
    inside = threading.Event()
    release = threading.Event()

    def slow_touch() -> None:
        with log.touching("writing"):
            inside.set()
            release.wait(5)

    worker = threading.Thread(target=slow_touch)
    worker.start()
    try:
        assert inside.wait(5)
        assert log.since("writing", mark), "a label still being written must veto"
    finally:
        release.set()
        worker.join(5)
    assert log.since("writing", mark)
    log.forget(mark)
    assert log.since("writing", mark), "forgetting drops only touches before the mark"
    log.forget(log.mark())
    assert not log.since("writing", log.mark())


class CountedImages(Images):
    def __init__(self, *names: str) -> None:
        super().__init__(*names)
        self.label_writes: list[tuple[str, str]] = []

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        self.label_writes.append((name, labels[LAST_USED_LABEL]))
        super().set_image_labels(name, labels, timeout=timeout)


def _collector(runtime: Images) -> ImageCollector:
    return ImageCollector(
        runtime,
        lambda: DiskUsage(100 * GIB, 95 * GIB),
        GcThresholds(high_percent=85, low_percent=80),
        clock=lambda: NOW,
        call_timeout=1,
    )


def test_starts_in_one_second_write_an_images_label_once() -> None:
    runtime = CountedImages("base", "other")
    collector = _collector(runtime)
    for _ in range(5):
        assert collector.touch_image("base", now=NOW + timedelta(milliseconds=300))
    assert collector.touch_image("other", now=NOW)
    assert collector.touch_image("base", now=NOW + timedelta(seconds=1))
    assert collector.touch_image("base", now=NOW + timedelta(seconds=1, milliseconds=900))
    assert collector.touch_image("other", now=NOW + timedelta(seconds=1))
    stamp = rfc3339(NOW, "seconds")
    later = rfc3339(NOW + timedelta(seconds=1), "seconds")
    assert runtime.label_writes == [
        ("base", stamp),
        ("other", stamp),
        ("base", later),
        ("other", later),
    ]
    assert runtime.images["base"].labels[LAST_USED_LABEL] == later


def test_a_touch_that_writes_nothing_still_keeps_the_image_from_a_pass() -> None:
    runtime = CountedImages("base")
    collector: ImageCollector

    def disk() -> DiskUsage:
        # After the listings, a second start in the same second: no label write.
        assert collector.touch_image("base", now=NOW)
        return DiskUsage(100 * GIB, 95 * GIB)

    collector = ImageCollector(
        runtime, disk, GcThresholds(high_percent=85, low_percent=80), clock=lambda: NOW
    )
    assert collector.touch_image("base", now=NOW)
    runtime.images["base"] = replace(runtime.images["base"], labels={})  # as the pass lists it
    collector.run_watermark(NOW)
    assert runtime.label_writes == [("base", rfc3339(NOW, "seconds"))]
    assert runtime.deleted == []


def test_an_image_deleted_and_pulled_again_is_labelled_again() -> None:
    runtime = CountedImages("base")
    collector = _collector(runtime)
    assert collector.touch_image("base", now=NOW)
    runtime.images["base"] = replace(runtime.images["base"], labels={})  # listed as old
    collector.run_watermark(NOW)
    assert runtime.deleted == ["base"]
    runtime.images["base"] = ImageRecord("base", GIB, created_at=NOW, updated_at=NOW)
    assert collector.touch_image("base", now=NOW)
    assert collector.touch_image("base", now=NOW)  # and once only, as before
    assert len(runtime.label_writes) == 2
    assert runtime.images["base"].labels[LAST_USED_LABEL] == rfc3339(NOW, "seconds")
