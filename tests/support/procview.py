"""``own_pid_proc`` (module fixture): a ``/proc`` of a PID namespace of its own, as
the agent's pod sees it on the chart's default install (no ``hostPID``, no
``agent.hostProc``): there a task's pid names nothing, or another process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def own_pid_proc() -> Iterator[str]:
    """A ``/proc`` of a PID namespace of its own (its pid 1 a ``sleep``), as the
    agent's pod has it on the chart's default install."""
    holder = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sleep", "3600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = f"/proc/{holder.pid}/root/proc"

    def mounted() -> bool:
        try:
            return Path(proc, "1", "comm").read_text().strip() == "sleep"
        except OSError:
            return False

    try:
        wait_for(mounted, timeout=10, what="a /proc of a PID namespace of its own")
        yield proc
    finally:
        holder.kill()
        holder.wait(timeout=10)
