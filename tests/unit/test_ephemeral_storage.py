"""A sandbox's disk use is bounded: its ``ephemeralStorage`` limit (its own, else its
namespace's default) travels on its container, its writable layer and logs are
measured as ``du`` counts them, and one over its limit is stopped naming both."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from sandlot.adapters.containerd.containers import writable_dir
from sandlot.adapters.diskuse import disk_use
from sandlot.api.keys import EPHEMERAL_STORAGE_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.ephemeralstorage import (
    KEEP,
    DiskUse,
    decide_storage,
    human_bytes,
    limit_labels,
    limit_of,
)
from sandlot.policy.limits import (
    DefaultLimits,
    LimitRefused,
    check_limits,
    merge,
    parse_defaults,
    with_defaults,
)

MI = 2**20

# ------------------------------------------------------------------ the decision


@pytest.mark.parametrize(
    ("use", "limit", "stops"),
    [
        (DiskUse(0, 1), 8 * MI, False),
        (DiskUse(8 * MI, 40), 8 * MI, False),
        (DiskUse(8 * MI + 4096, 41), 8 * MI, True),
        (DiskUse(32 * MI, 3), 8 * MI, True),
        (DiskUse(1 * MI, 200, complete=False), 8 * MI, True),
    ],
    ids=["empty", "exactly at the limit", "one block over", "far over", "too many files"],
)
def test_a_sandbox_is_stopped_only_past_its_limit_or_when_unmeasurable(
    use: DiskUse, limit: int, stops: bool
) -> None:
    decision = decide_storage(use, limit)
    assert decision.stop is stops
    if not stops:
        assert decision == KEEP


def test_the_stop_message_names_the_use_and_the_limit() -> None:
    message = decide_storage(DiskUse(32 * MI + 8192, 5), 8 * MI).message
    assert "32.0Mi" in message and str(32 * MI + 8192) in message, message
    assert "limit of 8.0Mi" in message and str(8 * MI) in message, message


def test_an_unmeasurable_sandbox_is_told_why() -> None:
    message = decide_storage(DiskUse(MI, 200, complete=False), 8 * MI).message
    assert "more than 200 files" in message and "8.0Mi" in message, message


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (1023, "1023"), (1024, "1.0Ki"), (int(1.5 * MI), "1.5Mi"), (3 * 2**40, "3.0Ti")],
    ids=["zero", "bytes", "one KiB", "MiB", "TiB"],
)
def test_byte_counts_read_as_binary_units(n: int, text: str) -> None:
    assert human_bytes(n) == text


# ------------------------------------------------------------------ the limit


@pytest.mark.parametrize(
    ("limits", "labels"),
    [
        ({}, {}),
        ({"ephemeralStorage": "8Mi"}, {EPHEMERAL_STORAGE_LABEL: str(8 * MI)}),
        ({"ephemeralStorage": "1.5Gi"}, {EPHEMERAL_STORAGE_LABEL: "1610612736"}),
        ({"ephemeralStorage": "1e9"}, {EPHEMERAL_STORAGE_LABEL: "1000000000"}),
    ],
    ids=["none", "binary suffix", "fraction", "exponent"],
)
def test_the_limit_travels_on_the_container_in_bytes(
    limits: dict[str, str], labels: dict[str, str]
) -> None:
    spec = SandboxSpec.model_validate({"image": "i", "resources": {"limits": limits}})
    assert limit_labels(spec) == labels
    assert limit_of(labels) == (int(next(iter(labels.values()))) if labels else None)


@pytest.mark.parametrize(
    "value", ["", "lots", "-5", "0", "1.5"], ids=["empty", "word", "negative", "zero", "fraction"]
)
def test_a_label_that_is_no_byte_count_is_no_limit(value: str) -> None:
    assert limit_of({EPHEMERAL_STORAGE_LABEL: value}) is None


def test_a_namespace_default_applies_and_a_sandboxs_own_limit_wins() -> None:
    agent = DefaultLimits("1Gi", "1", 1024)
    namespace = merge(agent, parse_defaults("ephemeralStorage=2Gi, memory=512Mi"))
    assert namespace == DefaultLimits("512Mi", "1", 1024, "2Gi")
    plain = with_defaults(SandboxSpec(image="i"), namespace)
    assert plain.resources is not None and plain.resources.limits.ephemeral_storage == "2Gi"
    own = SandboxSpec.model_validate(
        {"image": "i", "resources": {"limits": {"ephemeralStorage": "64Mi"}}}
    )
    filled = with_defaults(own, namespace)
    assert filled.resources is not None and filled.resources.limits.ephemeral_storage == "64Mi"


def test_without_any_disk_limit_none_is_required() -> None:
    spec = with_defaults(SandboxSpec(image="i"), DefaultLimits("1Gi", "1", 1024))
    assert spec.resources is not None and spec.resources.limits.ephemeral_storage is None
    check_limits(spec, 1024)  # memory, CPU and pids are required; disk is not


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ephemeralStorage=0", "not a positive quantity"),
        ("ephemeralStorage=512Ki", "ephemeralStorage '512Ki' is below the floor of 1Mi"),
        ("ephemeralStorage=big", "not a Kubernetes quantity"),
        ("ephemeral-storage=1Gi", "is not one of .*ephemeralStorage=Q"),
    ],
    ids=["zero", "below the floor", "not a quantity", "kubelet's spelling"],
)
def test_a_bad_namespace_disk_default_names_the_part(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_defaults(text)


def test_a_disk_limit_below_the_floor_is_refused_naming_the_field() -> None:
    # An object stored before the CRD's rule: the agent refuses it at the start.
    spec = SandboxSpec.model_validate(
        {
            "image": "i",
            "resources": {"limits": {"memory": "64Mi", "cpu": "1", "ephemeralStorage": "1"}},
        }
    )
    with pytest.raises(LimitRefused, match=r"spec\.resources\.limits\.ephemeralStorage '1'"):
        check_limits(spec, 1024)


# ------------------------------------------------------------------ the measurement


def _write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(b"x" * size)
        f.flush()
        os.fsync(f.fileno())


def _blocks(*paths: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in paths)


def test_allocated_blocks_are_counted_across_the_tree_and_single_files(tmp_path: Path) -> None:
    layer, logs = tmp_path / "upper", tmp_path / "logs"
    _write(layer / "a" / "b" / "data", 3 * MI)
    _write(logs / "x.log", 100_000)
    use = disk_use([layer, logs / "x.log", logs / "x.log.1"], max_entries=100)
    expected = _blocks(layer, layer / "a", layer / "a" / "b", layer / "a" / "b" / "data")
    assert use == DiskUse(expected + _blocks(logs / "x.log"), entries=5)
    assert use.bytes >= 3 * MI + 100_000


def test_a_sparse_file_counts_what_it_holds_not_its_length(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as f:
        f.truncate(1 << 30)
    assert disk_use([sparse], max_entries=10).bytes < MI


def test_symlinks_are_not_followed_and_hard_links_count_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside / "big", 4 * MI)
    layer = tmp_path / "upper"
    layer.mkdir()
    (layer / "to-file").symlink_to(outside / "big")
    (layer / "to-dir").symlink_to(outside, target_is_directory=True)
    _write(layer / "one", MI)
    os.link(layer / "one", layer / "two")
    use = disk_use([layer], max_entries=100)
    assert use.bytes < 2 * MI, use
    assert use.entries == 5  # the layer, two symlinks, two names of one file


def test_a_walk_stops_at_its_cap_and_says_so(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    assert disk_use([tmp_path], max_entries=51).complete
    capped = disk_use([tmp_path], max_entries=20)
    assert not capped.complete and capped.entries == 20


def test_what_is_absent_counts_nothing(tmp_path: Path) -> None:
    assert disk_use([tmp_path / "gone", tmp_path / "gone.log"], max_entries=10) == DiskUse(0, 0)


# ------------------------------------------------------------------ the writable layer


def _mount(kind: str, source: str, *options: str) -> SimpleNamespace:
    return SimpleNamespace(type=kind, source=source, options=list(options))


@pytest.mark.parametrize(
    ("mounts", "found"),
    [
        (
            [
                _mount(
                    "overlay",
                    "overlay",
                    "index=off",
                    "workdir=/s/9/work",
                    "upperdir=/s/9/fs",
                    "lowerdir=/s/1/fs",
                )
            ],
            "/s/9/fs",
        ),
        ([_mount("bind", "/s/4/fs", "rbind", "rw")], "/s/4/fs"),
        ([_mount("bind", "/s/4/fs", "rbind", "ro")], None),
        ([_mount("overlay", "overlay", "lowerdir=/s/2/fs:/s/1/fs")], None),
        ([], None),
    ],
    ids=["overlay upperdir", "parentless snapshot", "read-only view", "no upper", "no mounts"],
)
def test_the_writable_layer_is_found_in_the_snapshots_mounts(
    mounts: list[SimpleNamespace], found: str | None
) -> None:
    assert writable_dir(mounts) == found
