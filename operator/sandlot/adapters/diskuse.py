"""Disk use of directory trees and files as ``du -x`` counts it: allocated blocks
(``st_blocks * 512``), an inode with several links once, symlinks never followed,
no descent into another filesystem, and at most ``max_entries`` entries visited,
so a tree of a million empty files costs one bounded pass, not a stalled loop.
Entries that vanish while they are walked are skipped (the tenant is writing)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from sandlot.policy.ephemeralstorage import DiskUse


class _Walk:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.bytes = 0
        self.entries = 0
        self.seen: set[tuple[int, int]] = set()

    def count(self, st: os.stat_result) -> bool:
        """Add one entry; False once the cap is passed (the walk stops)."""
        if self.entries >= self.max_entries:
            return False
        self.entries += 1
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in self.seen:
                return True
            self.seen.add((st.st_dev, st.st_ino))
        self.bytes += st.st_blocks * 512
        return True

    def tree(self, root: Path) -> bool:
        """Count ``root`` and everything under it on its filesystem; False at the cap."""
        try:
            top = root.lstat()
        except FileNotFoundError:
            return True
        if not self.count(top):
            return False
        pending = [str(root)] if stat.S_ISDIR(top.st_mode) else []
        while pending:
            with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if not self.count(st):
                        return False
                    if stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev:
                        pending.append(entry.path)
        return True


def disk_use(trees: Iterable[str | Path], max_entries: int) -> DiskUse:
    """What ``trees`` (directories or single files; absent ones count 0) take on disk."""
    walk = _Walk(max_entries)
    for tree in trees:
        if not walk.tree(Path(tree)):
            return DiskUse(walk.bytes, walk.entries, complete=False)
    return DiskUse(walk.bytes, walk.entries)


__all__ = ["disk_use"]
