"""The file operations behind ``policy.sandboxlogs``: FIFOs, capped log files, listing."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from sandlot.policy.sandboxlogs import FIFO_SUFFIX, FRESH_SUFFIX, LOG_SUFFIX, ROTATED_SUFFIX, fits

PIPE_SIZE = 1024 * 1024  # what a task may write while nobody reads (an agent restart)


def log_files(directory: str | Path) -> set[str]:
    """The names of the regular files in ``directory`` (empty when it is absent)."""
    names: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    names.add(entry.name)
    return names


def fifo_stems(directory: str | Path) -> set[str]:
    """The stems of the FIFOs in ``directory``."""
    stems: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                if entry.name.endswith(FIFO_SUFFIX) and stat.S_ISFIFO(
                    entry.stat(follow_symlinks=False).st_mode
                ):
                    stems.add(entry.name.removesuffix(FIFO_SUFFIX))
    return stems


def open_fifo(path: str | Path) -> int:
    """Make the FIFO at ``path`` if absent and open it for reading, non-blocking.
    Opened read-write: the agent then holds a writer too, so a read never sees an
    end of file between the task's writers (none yet, or its shim restarting) and
    the pipe lives as long as someone holds it."""
    with contextlib.suppress(FileExistsError):
        os.mkfifo(path, 0o600)
    if not stat.S_ISFIFO(os.lstat(path).st_mode):
        raise OSError(f"{path} exists and is not a FIFO")
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # best effort: root may, others up to a limit
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return fd


def remove(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()


class CappedLog:
    """An append-only log file never over ``max_bytes`` (0: no cap): a write that
    would cross it fills the file to the cap, renames it to ``.log.1`` (replacing
    the previous generation) and goes on in a new file."""

    def __init__(self, path: str | Path, max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._fd = self._open()
        self.size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = fits(self.size, len(view), self.max_bytes)
            if n == 0:
                self.rotate()
                continue
            written = os.write(self._fd, view[:n])
            self.size += written
            view = view[written:]

    def rotate(self) -> None:
        """Keep the full file as ``.log.1`` and go on in an empty one, with a file at
        the log's path at every moment: a reader (``sandlot logs --follow``, the
        storage pass) never finds it missing, which it would read as the sandbox gone.
        The full file is linked to its new name, then an empty file made beside it is
        renamed over the path (both atomic)."""
        stem = self.path.name.removesuffix(LOG_SUFFIX)
        previous = self.path.with_name(stem + ROTATED_SUFFIX)
        fresh = self.path.with_name(stem + FRESH_SUFFIX)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(previous)
        with contextlib.suppress(FileNotFoundError):  # removed by hand: start anew
            os.link(self.path, previous)
        fd = os.open(
            fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o640
        )
        try:
            os.replace(fresh, self.path)
        except OSError:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        self.size = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


__all__ = ["PIPE_SIZE", "CappedLog", "fifo_stems", "log_files", "open_fifo", "remove"]
