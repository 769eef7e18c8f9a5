"""A fake clock for controller tests: one moment, read as a datetime (the wall
clock) and as monotonic seconds (what liveness and the work queue time on). The
wall clock can be stepped apart from the monotonic one, as NTP steps it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)) -> None:
        self.start = start
        self.elapsed = 0.0
        self.wall_step = timedelta(0)

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed) + self.wall_step

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds}s)")
        self.elapsed += seconds

    def step_wall(self, by: timedelta) -> None:
        """Step the wall clock (either way); monotonic time does not move."""
        self.wall_step += by

    def advance_to(self, moment: datetime) -> None:
        self.advance((moment - self.now()).total_seconds())
