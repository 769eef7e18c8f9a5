"""``sandlot logs``: a sandbox's output file sent on the stdout channel.

The file is the one the agent appends its task's output to (``policy.sandboxlogs``):
stdout and stderr interleaved as written. ``--tail N`` starts at the N-th line from the
end; ``--follow`` keeps reading as the file grows, and ends when the sandbox is
no longer Running here (after the last bytes are sent), when the file is removed
at teardown, when the client goes away or when the agent stops. A rotation
(the file renamed to ``.log.1``, a new one begun) is noticed as a new file at the
path: the rest of the open one is sent first, then the new one from its start. Waiting for more is a
bounded receive on the
connection, so a client that left is noticed within one wait.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from sandlot.policy.streams import STDOUT, encode_frame, tail_offset

CHUNK = 32 * 1024
TAIL_WINDOW = 64 * 1024
# The most a --tail reads back: a tenant's gigabytes without a newline must not be
# read whole for one request; past it, the tail starts mid-line.
TAIL_MAX = 1024 * 1024
FOLLOW_WAIT = 0.25  # seconds between looks at a followed file that did not grow


class ClientGone(Exception):
    """The connection closed while a log was being sent."""


def start_offset(handle: BinaryIO, lines: int | None, most: int = TAIL_MAX) -> int:
    """Where the last ``lines`` lines of the open file begin (0 for the whole file),
    looking back at most ``most`` bytes: lines longer than that are cut."""
    size = os.fstat(handle.fileno()).st_size
    if lines is None:
        return 0
    window = min(TAIL_WINDOW, most)
    while True:
        begin = max(0, size - window)
        handle.seek(begin)
        data = handle.read(size - begin)
        offset = tail_offset(data, size, lines)
        if offset > begin or begin == 0 or window >= most:
            return offset
        window = min(window * 4, most)


def _send_range(
    handle: BinaryIO, start: int, end: int | None, send: Callable[[bytes], None]
) -> int:
    """Send bytes ``start``..``end`` (None: the current end); the offset reached."""
    handle.seek(start)
    position = start
    while end is None or position < end:
        want = CHUNK if end is None else min(CHUNK, end - position)
        data = handle.read(want)
        if not data:
            break
        send(encode_frame(STDOUT, data))
        position += len(data)
    return position


def stream_log(
    path: Path,
    *,
    tail: int | None,
    follow: bool,
    running: Callable[[], bool],
    send: Callable[[bytes], None],
    wait: Callable[[float], Any],
    stopping: Callable[[], bool],
) -> None:
    """Send the log at ``path``. ``wait(seconds)`` waits on the connection and raises
    ``ClientGone`` once it closed; ``running()`` says whether the sandbox still runs here."""
    handle = path.open("rb")
    try:
        position = _send_range(handle, start_offset(handle, tail), None, send)
        while follow and not stopping():
            was_running = running()
            try:
                now_at_path = path.stat().st_ino
            except FileNotFoundError:
                return  # removed at teardown: the sandbox is gone
            reached = _send_range(handle, position, None, send)
            if os.fstat(handle.fileno()).st_ino != now_at_path:
                # Rotated before the look at the path: the open file (now .log.1) was
                # whole then, and has just been sent to its end. Go on in the new one.
                handle.close()
                handle = path.open("rb")
                position = 0
                continue
            if reached == position:
                if not was_running:
                    return  # it had ended before this last read found nothing more
                wait(FOLLOW_WAIT)
            position = reached
    finally:
        handle.close()


__all__ = ["ClientGone", "start_offset", "stream_log"]
