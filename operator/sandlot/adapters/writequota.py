"""A hard cap on what a container can write, held by the filesystem as it writes.

Measuring a writable layer (``agent.ephemeralstorage``) stops a sandbox after it
passed its limit: a writer faster than the checks overshoots. Where containerd's
root is on btrfs with quotas enabled, the agent turns a new container's empty
upper directory (the overlay snapshot's ``fs``) into a btrfs subvolume of its own
and limits that subvolume's qgroup to the sandbox's ephemeral-storage limit before
the task starts: a write past it fails with EDQUOT in the writer, and the node's
disk never holds more than the limits allow. containerd removes the snapshot as
before (an empty subvolume is removed by ``rmdir``).

Ext4 and XFS project quotas would do the same on those filesystems, but need a
kernel built with quota support (``CONFIG_QUOTA``; XFS's quota): the kernels this
was built on have neither, so btrfs is the one used; elsewhere the agent measures
only, and says so once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

BTRFS_MAGIC = 0x94
_PATH_NAME_MAX = 4087
_VOL_ARGS = struct.Struct(f"=q{_PATH_NAME_MAX + 1}s")  # struct btrfs_ioctl_vol_args
_LIMIT_ARGS = struct.Struct("=6Q")  # qgroupid, then struct btrfs_qgroup_limit
_LIMIT_MAX_RFER = 1 << 0


def _ioc(direction: int, number: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (BTRFS_MAGIC << 8) | number


SUBVOL_CREATE = _ioc(1, 14, _VOL_ARGS.size)  # _IOW(BTRFS_IOCTL_MAGIC, 14, ...)
QGROUP_LIMIT = _ioc(2, 43, _LIMIT_ARGS.size)  # _IOR(BTRFS_IOCTL_MAGIC, 43, ...)


class QuotaUnavailable(Exception):
    """The directory's filesystem cannot hold a write cap (not btrfs, quotas off)."""


class LayerNotEmpty(QuotaUnavailable):
    """This one directory already holds files (a copied root filesystem)."""


def filesystem_type(path: str | Path, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the filesystem mounted deepest above ``path``."""
    target = os.path.realpath(path)
    best, kind = "", ""
    for line in Path(mountinfo).read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[sep + 1]
    return kind


def cap_writes(upper: str | Path, limit: int) -> None:
    """Make the empty directory ``upper`` a btrfs subvolume whose qgroup holds at most
    ``limit`` bytes. Raises ``QuotaUnavailable`` where that cannot be (the directory
    is left as it was), ``OSError`` for anything else."""
    path = Path(upper)
    if filesystem_type(path) != "btrfs":
        raise QuotaUnavailable(f"{path} is not on btrfs")
    st = path.stat()
    if any(path.iterdir()):
        raise LayerNotEmpty(f"{path} is not empty: a copied root filesystem")
    path.rmdir()
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # A buffer, not bytes: the call copies at most 1024 bytes of an immutable one.
        args = bytearray(_VOL_ARGS.pack(0, path.name.encode()))
        fcntl.ioctl(parent, SUBVOL_CREATE, args, True)
    except BaseException:
        path.mkdir(mode=st.st_mode & 0o7777)
        raise
    finally:
        os.close(parent)
    os.chown(path, st.st_uid, st.st_gid)
    os.chmod(path, st.st_mode & 0o7777)
    sub = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        args = bytearray(_LIMIT_ARGS.pack(0, _LIMIT_MAX_RFER, limit, 0, 0, 0))
        fcntl.ioctl(sub, QGROUP_LIMIT, args, True)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ENOENT, errno.EINVAL):
            # Quotas are off on this filesystem: a plain subvolume is a directory still.
            raise QuotaUnavailable(f"btrfs quotas are not enabled under {path}") from None
        raise
    finally:
        os.close(sub)


__all__ = [
    "QGROUP_LIMIT",
    "SUBVOL_CREATE",
    "LayerNotEmpty",
    "QuotaUnavailable",
    "cap_writes",
    "filesystem_type",
]
