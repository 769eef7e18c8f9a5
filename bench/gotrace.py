"""The Go runtime's garbage-collector trace of a process (``GODEBUG=gctrace=1``),
read back as cycles in time, so the GC CPU of a window known only afterwards can be
set beside the work done in it."""

from __future__ import annotations

import os
import re
from pathlib import Path

GC_LINE = re.compile(
    r"^gc \d+ @(?P<at>[\d.]+)s \d+%: (?P<clock>[\d.+]+) ms clock, "
    r"(?P<cpu>[\d.+/]+) ms cpu"
)


def process_started(pid: int) -> float:
    """Epoch seconds the process started (its starttime after the machine's boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    boot = next(
        int(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def parse_cycles(text: str, started: float) -> list[tuple[float, float, float]]:
    """(start epoch seconds, clock seconds, CPU seconds) of every cycle in ``text``,
    a log holding the runtime's ``gc N @T s P%: a+b+c ms clock, d+e/f/g+h ms cpu``
    lines among others; ``started`` is the process's start (T counts from it)."""
    found = []
    for line in text.splitlines():
        m = GC_LINE.match(line)
        if m:
            clock = sum(float(x) for x in m["clock"].split("+")) / 1000
            cpu = sum(float(x) for x in re.split(r"[+/]", m["cpu"])) / 1000
            found.append((started + float(m["at"]), clock, cpu))
    return found


def spent_in(
    cycles: list[tuple[float, float, float]], began: float, ended: float
) -> tuple[int, float]:
    """The cycles overlapping ``began``..``ended``, and their CPU seconds inside it:
    a cycle's CPU is spread evenly over its clock time."""
    count, cpu = 0, 0.0
    for start, clock, used in cycles:
        inside = min(ended, start + clock) - max(began, start)
        if inside > 0 or began <= start < ended:
            count += 1
            cpu += used * (max(inside, 0.0) / clock if clock > 0 else 1.0)
    return count, cpu


class GoGcTrace:
    """The GC cycles of the process ``pid``, whose output goes to ``log``."""

    def __init__(self, log: Path, pid: int) -> None:
        self.log, self.started = log, process_started(pid)

    def cycles(self) -> list[tuple[float, float, float]]:
        """Every cycle the log holds now (``parse_cycles``)."""
        return parse_cycles(self.log.read_text(errors="replace"), self.started)
