"""How the long-running programs (``sandlot operator``, ``sandlot agent``) end.

The kubelet sends SIGTERM and, 30 s later, SIGKILL. Both programs stop their
loops within a few seconds, every call they make being bounded; what is left at
that point are threads blocked in a request to an API server that went away.
Python's own exit would wait for them (``concurrent.futures`` joins its workers
at exit) or, with daemon threads still writing logs during interpreter teardown,
abort. So a program that has finished its orderly stop leaves with ``os._exit``
after flushing its output, and a watchdog armed by the signal ends it the same
way if the orderly stop itself overruns ``EXIT_DEADLINE``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn

log = logging.getLogger(__name__)

EXIT_DEADLINE = 8.0  # seconds from SIGTERM to exit, whatever the API server does


def exit_now(code: int) -> NoReturn:
    """Flush what was logged and printed, then end the process without its teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


class ExitWatchdog:
    """Armed once by the first stop signal; ends the process when the stop overruns."""

    def __init__(self, deadline: float = EXIT_DEADLINE) -> None:
        self.deadline = deadline
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self) -> None:
        with self._lock:
            if self._timer is not None:
                return
            self._timer = threading.Timer(self.deadline, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        log.error("stop did not finish within %.0fs of the signal; exiting now", self.deadline)
        exit_now(1)


__all__ = ["EXIT_DEADLINE", "ExitWatchdog", "exit_now"]
