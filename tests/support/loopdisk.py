"""A small filesystem of a given kind on a loop device, for the disk tests."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


@contextlib.contextmanager
def loop_disk(tmp_path: Path, size: int, mkfs: Sequence[str], prefix: str) -> Iterator[Path]:
    """``size`` bytes made by ``mkfs`` (the image path appended), loop-mounted under a
    short /tmp name (containerd's sockets under it must stay within a socket path's
    104 bytes); always unmounted and its loop device released."""
    image = tmp_path / "disk.img"
    mount = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    with image.open("wb") as f:
        f.truncate(size)
    subprocess.run([*mkfs, str(image)], check=True, timeout=120)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True, timeout=60)
    try:
        yield mount
    finally:
        done = subprocess.run(["umount", str(mount)], capture_output=True, timeout=120)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=60)
        attached = subprocess.run(
            ["losetup", "-j", str(image)], capture_output=True, text=True, timeout=30
        )
        for line in attached.stdout.splitlines():
            subprocess.run(["losetup", "-d", line.split(":", 1)[0]], timeout=30, check=False)
        with contextlib.suppress(OSError):
            mount.rmdir()
