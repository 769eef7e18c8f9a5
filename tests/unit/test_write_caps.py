"""The filesystem cap on a writable layer: where it sits against the limit, and the
btrfs ioctl requests and mount lookup it rests on (plain data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.adapters.writequota import QGROUP_LIMIT, SUBVOL_CREATE, filesystem_type
from sandlot.policy.ephemeralstorage import DiskUse, decide_storage, write_cap


@pytest.mark.parametrize("limit", [4 * 2**20, 2**30, 10 * 2**30])
def test_a_writer_held_at_its_cap_is_over_its_limit_and_stopped(limit: int) -> None:
    cap = write_cap(limit)
    assert cap > limit
    # btrfs stops a writer a few extents short of the qgroup's limit (9.98 of 10 MiB seen).
    held = cap - 64 * 1024
    assert decide_storage(DiskUse(bytes=held, entries=3, complete=True), limit).stop
    assert not decide_storage(DiskUse(bytes=limit, entries=3, complete=True), limit).stop


def test_the_ioctl_requests_are_linuxs_btrfs_numbers() -> None:
    # From linux/btrfs.h: _IOW(0x94, 14, struct btrfs_ioctl_vol_args) (4096 bytes) and
    # _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args) (48 bytes).
    assert SUBVOL_CREATE == 0x5000940E
    assert QGROUP_LIMIT == 0x8030942B


def test_the_filesystem_of_a_path_is_its_deepest_mount(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "30 22 7:0 / /var/lib/containerd rw shared:2 - btrfs /dev/loop0 rw,space_cache\n"
        "31 22 7:1 / /var/lib/containerd2 rw shared:3 - xfs /dev/loop1 rw\n"
    )
    snap = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/7/fs"
    assert filesystem_type(snap, str(info)) == "btrfs"
    assert filesystem_type("/var/lib/containerd2/x", str(info)) == "xfs"
    assert filesystem_type("/var/lib/other", str(info)) == "ext4"
