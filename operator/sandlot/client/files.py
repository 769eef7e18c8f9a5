"""A sandbox's files, read and written by its node's agent (``sandboxes/files``):
nothing is needed in the image, not even a shell.

Each operation is one stream: a read is stdout frames then the status; a write is
stdin frames, a close of stdin, then the status; list and stat are one JSON
document on stdout. A refusal is a ``FileError`` with the HTTP code the agent's
status carries (404, 403 outside the root, 413 over the cap, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandlot.adapters.streamclient import Stream
from sandlot.client.commands import CHUNK, read_status, stdout_until_status
from sandlot.client.errors import FileError, SandboxGone, SandlotError, TimedOut
from sandlot.policy.streams import (
    LIST,
    MKDIR,
    READ,
    REMOVE,
    STAT,
    STDIN,
    WRITE,
    close_stdin_frame,
    encode_frame,
)

FILE_TIMEOUT = 300.0  # seconds one file operation may take, by default


@dataclass(frozen=True)
class FileInfo:
    name: str
    type: str  # "file", "dir", "symlink" or "other"
    size: int  # bytes
    mode: int  # permission bits
    mtime: int  # seconds since the epoch

    @classmethod
    def of(cls, doc: dict[str, Any]) -> FileInfo:
        return cls(
            str(doc["name"]),
            str(doc["type"]),
            int(doc["size"]),
            int(doc["mode"]),
            int(doc["mtime"]),
        )


class Files:
    """``sandbox.files``; every call takes ``timeout`` (seconds, default ``FILE_TIMEOUT``)."""

    def __init__(
        self,
        open_op: Callable[[str, str], Stream],
        gone: Callable[[], SandboxGone | None],
    ) -> None:
        self._open = open_op
        self._gone = gone

    def read(self, path: str, *, timeout: float = FILE_TIMEOUT) -> bytes:
        return self._do(READ, path, None, timeout)

    def write(self, path: str, data: bytes | str, *, timeout: float = FILE_TIMEOUT) -> None:
        """Replace ``path`` at once with ``data`` (owned by the sandbox's user)."""
        self._do(WRITE, path, data.encode() if isinstance(data, str) else data, timeout)

    def list(self, path: str, *, timeout: float = FILE_TIMEOUT) -> list[FileInfo]:
        return [FileInfo.of(d) for d in json.loads(self._do(LIST, path, None, timeout))]

    def stat(self, path: str, *, timeout: float = FILE_TIMEOUT) -> FileInfo:
        return FileInfo.of(json.loads(self._do(STAT, path, None, timeout)))

    def exists(self, path: str, *, timeout: float = FILE_TIMEOUT) -> bool:
        try:
            self.stat(path, timeout=timeout)
        except FileError as e:
            if e.status == 404:
                return False
            raise
        return True

    def mkdir(self, path: str, *, timeout: float = FILE_TIMEOUT) -> None:
        """Make the directory ``path`` (mode 0755, owned by the sandbox's user); its
        parent must exist, and a directory already there is no error."""
        self._do(MKDIR, path, None, timeout)

    def remove(self, path: str, *, timeout: float = FILE_TIMEOUT) -> None:
        self._do(REMOVE, path, None, timeout)

    def _do(self, op: str, path: str, data: bytes | None, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        stream = self._open(op, path)
        out: list[bytes] = []
        try:
            if data is not None:
                _send_all(stream, data)
            status = stdout_until_status(stream, lambda: deadline - time.monotonic(), out.append)
        except TimeoutError:
            raise TimedOut(f"files {op} {path}: no answer within {timeout}s") from None
        finally:
            stream.close()
        outcome = read_status(status)
        if outcome.exit_code == 0:
            return b"".join(out)
        if (gone := self._gone()) is not None:
            raise gone
        if outcome.status is None:
            raise SandlotError(f"files {op} {path}: {outcome.message}")
        raise FileError(path, outcome.code, outcome.message)


def _send_all(stream: Stream, data: bytes) -> None:
    """``data`` on stdin, then its close. A send the agent cut short (it refused the
    write and closed) stops here: its status, read next, says why."""
    try:
        for start in range(0, len(data), CHUNK):
            stream.send(encode_frame(STDIN, data[start : start + CHUNK]))
        stream.send(close_stdin_frame())
    except Exception:  # websocket's closed-connection errors are not all OSErrors
        return


__all__ = ["FILE_TIMEOUT", "FileInfo", "Files"]
