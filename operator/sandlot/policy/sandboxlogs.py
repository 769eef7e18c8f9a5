"""What becomes of the sandboxes' stdout/stderr files: pure.

A sandbox's task writes its stdout and stderr into a FIFO the agent reads
(``<state-dir>/logs/<node>/<namespace>_<name>_<uid>.fifo``), and the agent appends what
it reads to ``<namespace>_<name>_<uid>.log`` in its log directory. The agent is
the only writer, so the size cap holds as the bytes are written: a chunk that
would cross it fills the file to the cap exactly, the file becomes ``.log.1``
(one previous generation is kept, the one before is dropped) and the rest starts
the new file. Nothing is copied, nothing is lost to a race, and no file is ever
over the cap, however fast a tenant prints.

A periodic pass attaches the FIFOs of running containers the agent is not reading
(a restarted agent takes its containers' output back where the pipe held it),
detaches those whose container is gone, and removes the files of sandboxes that
are gone or ended once their container is torn down, so logs never outlive their
sandbox on the node's disk. A sandbox without a container on purpose (suspended)
keeps its files: the lifecycle (``policy.lifecycle.logs_kept``) says whose stay.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

LOG_SUFFIX = ".log"
ROTATED_SUFFIX = ".log.1"
FRESH_SUFFIX = ".log.new"  # the next file, made beside the full one and renamed over it
FIFO_SUFFIX = ".fifo"


def uid_of(filename: str) -> str | None:
    """The Sandbox uid a log file or FIFO belongs to; None for other files."""
    for suffix in (ROTATED_SUFFIX, FRESH_SUFFIX, LOG_SUFFIX, FIFO_SUFFIX):
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            _, sep, uid = stem.rpartition("_")
            return uid if sep and uid else None
    return None


def log_stem(namespace: str, name: str, uid: str) -> str:
    """The name a sandbox's log file and FIFO share, before their suffixes."""
    return f"{namespace}_{name}_{uid}"


def fits(size: int, incoming: int, max_bytes: int) -> int:
    """How many of ``incoming`` bytes go into a file holding ``size`` before it must
    rotate: all of them while they fit under ``max_bytes`` (0: no cap), else what
    fills it to the cap exactly (0 when it is full)."""
    if max_bytes <= 0:
        return incoming
    return max(0, min(incoming, max_bytes - size))


@dataclass(frozen=True)
class LogPlan:
    attach: list[str] = field(default_factory=list)  # stems
    # stem -> the token it was attached with when planned (None: not attached)
    detach: dict[str, int | None] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)  # file names


def plan_logs(
    files: Collection[str],
    fifos: Collection[str],
    attached: Mapping[str, int],
    live_uids: Collection[str],
    kept_uids: Collection[str] | None,
) -> LogPlan:
    """``files``: the log directory's file names; ``fifos``: the stems with a FIFO;
    ``attached``: the stems the agent reads, with their tokens. All three are taken *before*
    ``live_uids`` (the uids of the containers that exist) was read, so nothing is
    judged on an older listing than its container's: a sandbox starting meanwhile is
    live or was not listed. ``kept_uids``: the node's Sandboxes whose logs stay with
    or without a container (``policy.lifecycle.logs_kept``), read after the files;
    None (not known yet): no file is removed."""
    plan = LogPlan()
    for stem in sorted(fifos):
        uid = uid_of(stem + FIFO_SUFFIX)
        if uid is not None and uid in live_uids and stem not in attached:
            plan.attach.append(stem)
    for stem in sorted({*fifos, *attached}):  # read to the end, then unlinked
        uid = uid_of(stem + FIFO_SUFFIX)
        if uid is not None and uid not in live_uids:
            plan.detach[stem] = attached.get(stem)
    if kept_uids is None:
        return plan
    for name in sorted(files):
        uid = uid_of(name)
        if uid is None or name.endswith(FIFO_SUFFIX):
            continue
        if uid not in live_uids and uid not in kept_uids:
            plan.remove.append(name)
    return plan


__all__ = [
    "FIFO_SUFFIX",
    "FRESH_SUFFIX",
    "LOG_SUFFIX",
    "ROTATED_SUFFIX",
    "LogPlan",
    "fits",
    "log_stem",
    "plan_logs",
    "uid_of",
]
