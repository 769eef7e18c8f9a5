"""Host ID ranges of ``hostUsers: false`` sandboxes, and the spec that maps them."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest

from sandlot.adapters.containerd.remap import ROOT_DIR, shift_layer
from sandlot.adapters.runtime import ContainerInfo
from sandlot.agent.userns import UserRanges, ranges_in_use
from sandlot.api.keys import USERNS_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.ocispec import ImageConfig, build_oci_spec
from sandlot.policy.userns import (
    FIRST_ID,
    LAST_ID,
    RANGE_SIZE,
    IdRange,
    NoFreeRange,
    pick_range,
    with_user_namespace,
)

F, S = FIRST_ID, RANGE_SIZE


@pytest.mark.parametrize(
    ("in_use", "first"),
    [
        ([], F),
        ([IdRange(F)], F + S),
        ([IdRange(F + S)], F),
        ([IdRange(F), IdRange(F + 2 * S)], F + S),
        ([IdRange(F + 2 * S), IdRange(F)], F + S),
        ([IdRange(F + 10, 5)], F + S),
        ([IdRange(F - 10, 20)], F + S),
        ([IdRange(F - S, S)], F),
        ([IdRange(F, 3 * S + 1)], F + 4 * S),
        ([IdRange(F, S), IdRange(F + S // 2, 2 * S)], F + 3 * S),
        ([IdRange(0, 1000)], F),
    ],
    ids=[
        "none-taken",
        "first-taken",
        "gap-at-start",
        "gap-between",
        "unsorted",
        "small-foreign-range-inside",
        "range-straddling-the-start",
        "range-ending-at-the-start",
        "long-range-skips-blocks",
        "overlapping-held-ranges",
        "node-users-below",
    ],
)
def test_pick_range_takes_the_lowest_block_overlapping_none(
    in_use: list[IdRange], first: int
) -> None:
    chosen = pick_range(in_use)
    assert chosen == IdRange(first)
    assert not any(chosen.overlaps(r) for r in in_use)


def test_pick_range_refuses_when_every_block_is_taken() -> None:
    with pytest.raises(NoFreeRange, match="no free range"):
        pick_range([IdRange(F), IdRange(F + S)], last=F + 2 * S + 10)
    assert pick_range([], last=F + S - 1) == IdRange(F)
    with pytest.raises(NoFreeRange):
        pick_range([], last=F + S - 2)


def test_ranges_end_below_the_kernels_no_id() -> None:
    assert LAST_ID < 2**32 - 1
    assert (LAST_ID + 1 - FIRST_ID) // RANGE_SIZE > 60_000


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("16777216-65536", IdRange(F, S)),
        ("", None),
        ("12", None),
        ("a-b", None),
        ("-5-10", None),
        ("5-0", None),
    ],
    ids=["range", "empty", "no-size", "not-numbers", "negative", "empty-range"],
)
def test_label_round_trip_and_junk(text: str, parsed: IdRange | None) -> None:
    assert IdRange.from_label(text) == parsed
    if parsed is not None:
        assert parsed.label() == text


def _oci(**spec: Any) -> dict[str, Any]:
    sandbox = SandboxSpec.model_validate({"image": "i", "command": ["sh"], **spec})
    return build_oci_spec("sb", sandbox, ImageConfig(), hostname="h")


def test_spec_maps_the_range_to_root_inside() -> None:
    ids = IdRange(F + 3 * S)
    oci = with_user_namespace(_oci(hostUsers=False), ids)
    mapping = [{"containerID": 0, "hostID": F + 3 * S, "size": S}]
    assert oci["linux"]["uidMappings"] == mapping == oci["linux"]["gidMappings"]
    assert {"type": "user"} in oci["linux"]["namespaces"]
    (sysfs,) = [m for m in oci["mounts"] if m["destination"] == "/sys"]
    assert sysfs["type"] == "sysfs", "its own network namespace may mount sysfs"


@pytest.mark.parametrize(
    ("spec", "netns_path"),
    [({"hostNetwork": True}, None), ({}, "/run/netns/cni-1")],
    ids=["host-network", "joined-cni-netns"],
)
def test_sysfs_is_bound_read_only_without_a_network_namespace_of_its_own(
    spec: dict[str, Any], netns_path: str | None
) -> None:
    oci = _oci(hostUsers=False, **spec)
    for ns in oci["linux"]["namespaces"]:
        if ns["type"] == "network" and netns_path:
            ns["path"] = netns_path
    out = with_user_namespace(oci, IdRange(F))
    (sysfs,) = [m for m in out["mounts"] if m["destination"] == "/sys"]
    assert sysfs["type"] == "bind" and sysfs["source"] == "/sys"
    assert "ro" in sysfs["options"] and "rbind" in sysfs["options"]
    assert oci["mounts"] != out["mounts"], "the input spec is left alone"


def _container(cid: str, label: str | None) -> ContainerInfo:
    labels = {} if label is None else {USERNS_LABEL: label}
    return ContainerInfo(cid, "img", labels, cid, datetime(2026, 1, 1, tzinfo=UTC))


def test_reservations_and_labels_keep_concurrent_starts_apart() -> None:
    containers = [_container("a", IdRange(F).label()), _container("b", None)]
    ranges = UserRanges()

    def listing() -> Iterable[ContainerInfo]:
        return containers

    one = ranges.reserve("c1", listing)
    two = ranges.reserve("c2", listing)
    assert (one, two) == (IdRange(F + S), IdRange(F + 2 * S))
    assert ranges.reserve("c1", listing) == one, "a retried start keeps its range"
    # c1's container now exists and carries its range; the reservation goes.
    containers.append(_container("c1", one.label()))
    ranges.release("c1")
    assert ranges.reserve("c3", listing) == IdRange(F + 3 * S)
    ranges.release("c2")
    assert ranges.reserve("c4", listing) == IdRange(F + 2 * S), "a released range is reused"
    assert ranges_in_use(containers) == [IdRange(F), one]


def _layer(entries: list[tuple[str, bytes | None, int]], *, gzipped: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gzipped else "w") as tar:
        for name, data, uid in entries:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = uid
            info.uname = "someone"
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("./bin/sh")
        link.type, link.linkname = tarfile.LNKTYPE, "./bin/busybox"
        tar.addfile(link)
    return buf.getvalue()


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_shift_layer_moves_owners_and_entries_under_the_root_dir(gzipped: bool) -> None:
    layer = _layer(
        [
            ("./", None, 0),
            ("bin", None, 0),
            ("./bin/busybox", b"x" * 10, 0),
            ("home/app", b"y", 1000),
        ],
        gzipped=gzipped,
    )
    out = io.BytesIO()
    shift_layer(io.BytesIO(layer), out, F, add_root=True)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        got = {m.name: (m.uid, m.gid, m.uname, m.linkname) for m in tar.getmembers()}
        busybox = tar.extractfile(f"{ROOT_DIR}/bin/busybox")
        assert busybox is not None and busybox.read() == b"x" * 10
    assert got == {
        ROOT_DIR: (F, F, "", ""),
        f"{ROOT_DIR}/bin": (F, F, "", ""),
        f"{ROOT_DIR}/bin/busybox": (F, F, "", ""),
        f"{ROOT_DIR}/home/app": (F + 1000, F + 1000, "", ""),
        f"{ROOT_DIR}/bin/sh": (F, F, "", f"{ROOT_DIR}/bin/busybox"),
    }
