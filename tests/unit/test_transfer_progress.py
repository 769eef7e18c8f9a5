"""The Transfer path's byte count, from the progress events containerd 2.x sends:
config and layers only, a blob on the node counted as done but not fetched, a
layer fetched straight into its unpack counted by its extract events, never
going backwards."""

from __future__ import annotations

from typing import Any

import pytest

transfer = pytest.importorskip("sandlot.adapters.pulling.transfer")
progress_pb2 = pytest.importorskip("sandlot.adapters.containerd.gen.types.transfer.progress_pb2")
descriptor_pb2 = pytest.importorskip("sandlot.adapters.containerd.gen.types.descriptor_pb2")

MANIFEST = ("application/vnd.oci.image.manifest.v1+json", "sha256:m", 500)
CONFIG = ("application/vnd.oci.image.config.v1+json", "sha256:c", 300)
LAYER_A = ("application/vnd.oci.image.layer.v1.tar+gzip", "sha256:a", 1000)
LAYER_B = ("application/vnd.oci.image.layer.v1.tar", "sha256:b", 2000)


def _event(name: str, blob: tuple[str, str, int] | None = None, progress: int = 0) -> Any:
    event = progress_pb2.Progress(event=name, progress=progress)
    if blob is not None:
        media_type, digest, size = blob
        event.desc.CopyFrom(
            descriptor_pb2.Descriptor(media_type=media_type, digest=digest, size=size)
        )
    return event


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (
            [
                _event("Resolving from registry"),
                _event("waiting", MANIFEST),
                _event("complete", MANIFEST, 500),
            ],
            (0, 0, 0),
        ),
        (
            [
                _event("waiting", CONFIG),
                _event("waiting", LAYER_A),
                _event("downloading", LAYER_A, 400),
                _event("complete", CONFIG, 300),
                _event("complete", LAYER_A, 1000),
            ],
            (1300, 1300, 1300),
        ),
        (
            [
                _event("already exists", LAYER_A, 1000),
                _event("waiting", LAYER_B),
                _event("extracting", LAYER_B, 1500),
                _event("extracted", LAYER_B, 2000),
            ],
            (3000, 3000, 2000),
        ),
        (
            [_event("downloading", LAYER_B, 1500), _event("waiting", LAYER_B)],
            (1500, 2000, 1500),
        ),
    ],
    ids=[
        "index-and-manifests-not-counted",
        "fetched-config-and-layer",
        "present-layer-done-not-fetched-and-extract-counts",
        "never-goes-backwards",
    ],
)
def test_progress_events_sum_to_config_and_layer_bytes(
    events: list[Any], expected: tuple[int, int, int]
) -> None:
    reported: list[tuple[int, int]] = []
    tracker = transfer._Tracker(lambda done, total: reported.append((done, total)))
    for event in events:
        tracker.update(event)
    assert tracker.totals() == expected
    if expected[1]:
        assert reported[-1] == expected[:2]


def test_any_event_moves_the_stall_clock() -> None:
    tracker = transfer._Tracker(None)
    tracker.moved -= 100.0
    assert tracker.idle() >= 100.0
    tracker.update(_event("Resolving from registry"))
    assert tracker.idle() < 100.0
