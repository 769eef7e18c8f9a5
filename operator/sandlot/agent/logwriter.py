"""The agent writes its sandboxes' logs: one thread reads every task's output FIFO
and appends it to a ``CappedLog``, so the size cap holds as bytes are written
(``policy.sandboxlogs``).

One thread for the node: a selector wakes it for the FIFOs holding data, and it
reads at most ``CHUNK`` from each in turn, so a tenant printing as fast as it can
gets its turn like the others and its pipe fills, slowing it, not them. A write
that fails (a full disk) drops that chunk and counts it; the task is never blocked
by the agent's disk. While no agent reads (a restart), a task's writes wait in its
pipe (``PIPE_SIZE``) and then block; the next agent attaches the FIFO and takes
them from where they stopped. Detaching reads what is left, closes, and unlinks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import selectors
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandlot.adapters.logfiles import CappedLog, open_fifo
from sandlot.policy.sandboxlogs import FIFO_SUFFIX, LOG_SUFFIX

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
DRAIN_MOST = 16 * 1024 * 1024  # read on detach; the task is gone, so its pipe is finite
SELECT_WAIT = 0.5  # seconds; a stop is noticed within one


@dataclass
class _Attached:
    stem: str
    fd: int
    log: CappedLog
    token: int = 0


class LogWriter:
    def __init__(
        self,
        log_dir: str | Path,
        fifo_dir: str | Path,
        max_bytes: int,
        *,
        dropped: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.fifo_dir = Path(fifo_dir)
        self.max_bytes = max_bytes
        self._dropped = dropped
        self._selector = selectors.DefaultSelector()
        self._attached: dict[str, _Attached] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tokens = itertools.count(1)

    def fifo_path(self, stem: str) -> Path:
        return self.fifo_dir / f"{stem}{FIFO_SUFFIX}"

    def log_path(self, stem: str) -> Path:
        return self.log_dir / f"{stem}{LOG_SUFFIX}"

    def attached(self) -> dict[str, int]:
        """The stems read now, each with the token of its latest ``attach``."""
        with self._lock:
            return {stem: entry.token for stem, entry in self._attached.items()}

    def attach(self, stem: str) -> str:
        """Read ``stem``'s FIFO (made if absent) into its log from now on; the FIFO's
        path, for the task's stdout and stderr. Attaching twice is one attachment,
        with a new token: a ``detach`` planned before it does not take it away."""
        path = self.fifo_path(stem)
        with self._lock:
            if stem in self._attached:
                self._attached[stem].token = next(self._tokens)
            else:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                self.fifo_dir.mkdir(parents=True, exist_ok=True)
                fd = open_fifo(path)
                try:
                    capped = CappedLog(self.log_path(stem), self.max_bytes)
                    entry = _Attached(stem, fd, capped, next(self._tokens))
                except OSError:
                    os.close(fd)
                    raise
                self._attached[stem] = entry
                self._selector.register(fd, selectors.EVENT_READ, entry)
        return str(path)

    def detach(self, stem: str, token: int | None) -> bool:
        """Write what is left in ``stem``'s FIFO, stop reading it and unlink it, if it
        is still as seen when the detach was planned: attached with ``token``, or not
        attached (None: a FIFO left by a task that ended unread). False when it was
        attached again since (a new task of that sandbox): then it is kept."""
        with self._lock:
            entry = self._attached.get(stem)
            if (entry.token if entry is not None else None) != token:
                return False
            if entry is not None:
                del self._attached[stem]
                self._selector.unregister(entry.fd)
                moved = 0
                while moved < DRAIN_MOST and (n := self._move(entry)) > 0:
                    moved += n
                os.close(entry.fd)
                entry.log.close()
            with contextlib.suppress(FileNotFoundError):
                self.fifo_path(stem).unlink()
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="logwriter", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading (the FIFOs stay: the tasks' output waits in them for the next
        agent). Bounded by ``timeout``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            for entry in self._attached.values():
                os.close(entry.fd)
                entry.log.close()
            self._attached.clear()
            self._selector.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(SELECT_WAIT)
            except (OSError, ValueError):  # closed by stop()
                return
            with self._lock:
                for key, _mask in events:
                    entry: _Attached = key.data
                    if self._attached.get(entry.stem) is entry:  # not detached meanwhile
                        self._move(entry)

    def _move(self, entry: _Attached) -> int:
        """One read of ``entry``'s FIFO into its log: the bytes read (0: none waiting)."""
        try:
            data = os.read(entry.fd, CHUNK)
        except BlockingIOError:
            return 0
        except OSError as e:
            log.warning("cannot read the output of %s: %s", entry.stem, e)
            return 0
        try:
            entry.log.write(data)
        except OSError as e:
            log.warning("dropped %d bytes of %s's log: %s", len(data), entry.stem, e)
            self._dropped(len(data))
        return len(data)


__all__ = ["LogWriter"]
