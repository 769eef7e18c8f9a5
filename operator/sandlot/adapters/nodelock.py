"""One agent per node: an exclusive lock on a file on the node's own disk.

Two agents on one node (a DaemonSet rolled with a surge, a second one started by
hand) would each sweep as orphans what the other is starting, and both would run
the node's sandboxes. The agent takes ``fcntl.flock`` on ``<state dir>/agent-<node>.lock``
before it touches containerd and holds it for its life: the kernel drops the lock
when the process ends, however it ends, so a crashed agent never leaves it taken.
The holder writes its pid into the file, so the one that waits can say who holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class NodeLock:
    """The lock file of node ``node`` under ``state_dir``; ``try_acquire`` never blocks."""

    def __init__(self, state_dir: str, node: str) -> None:
        self.path = Path(state_dir) / f"agent-{node}.lock"
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """True once this process holds the lock; False while another does.
        OSError when the state directory cannot be made or the file opened."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid the holder wrote (``unknown`` if it wrote none yet)."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return "unknown"
        return text if text.isdigit() else "unknown"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
