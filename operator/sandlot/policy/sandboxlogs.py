"""What becomes of the sandboxes' stdout/stderr files: pure.

The shim appends each sandbox's output to ``<namespace>_<name>_<uid>.log`` in the
agent's log directory and keeps it open. A file over the size cap is rotated by
copy-and-truncate (one previous generation, ``.log.1``, is kept): the shim's
appends land at the new end of the truncated file, so nothing is reopened; a few
bytes written between the copy and the truncation are lost, the price of not
restarting the writer. A file whose container is gone (torn down) is removed with
its previous generation, so logs never outlive their sandbox on the node's disk.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

LOG_SUFFIX = ".log"
ROTATED_SUFFIX = ".log.1"


def uid_of(filename: str) -> str | None:
    """The Sandbox uid a log file belongs to; None for files that are not sandbox logs."""
    for suffix in (ROTATED_SUFFIX, LOG_SUFFIX):
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            _, sep, uid = stem.rpartition("_")
            return uid if sep and uid else None
    return None


@dataclass(frozen=True)
class LogPlan:
    rotate: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


def plan_logs(sizes: Mapping[str, int], live_uids: Collection[str], max_bytes: int) -> LogPlan:
    """``sizes``: file name -> bytes, listed *before* ``live_uids`` (the uids of the
    containers that exist) was read, so a file is never judged on an older listing
    than its container's. ``max_bytes`` 0: no rotation."""
    plan = LogPlan()
    for name in sorted(sizes):
        uid = uid_of(name)
        if uid is None:
            continue
        if uid not in live_uids:
            plan.remove.append(name)
        elif max_bytes and name.endswith(LOG_SUFFIX) and sizes[name] > max_bytes:
            plan.rotate.append(name)
    return plan


__all__ = ["LOG_SUFFIX", "ROTATED_SUFFIX", "LogPlan", "plan_logs", "uid_of"]
