"""The sandbox-log pass: rotate files over the cap, remove those of torn-down
containers (``policy.sandboxlogs`` decides)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sandlot.adapters.logfiles import log_sizes, remove, rotate
from sandlot.adapters.runtime import Runtime
from sandlot.api.keys import SANDBOX_UID_LABEL
from sandlot.policy.sandboxlogs import LogPlan, plan_logs

log = logging.getLogger(__name__)


class SandboxLogs:
    def __init__(
        self, directory: str, max_bytes: int, rt: Callable[[], Runtime], call_timeout: float
    ) -> None:
        self.directory = Path(directory) if directory else None
        self.max_bytes = max_bytes
        self._rt = rt
        self.call_timeout = call_timeout

    def pass_once(self) -> LogPlan:
        if self.directory is None:
            return LogPlan()
        sizes = log_sizes(self.directory)  # before the containers: see plan_logs
        containers = self._rt().list_containers(timeout=self.call_timeout)
        live = {c.labels.get(SANDBOX_UID_LABEL, "") for c in containers} - {""}
        plan = plan_logs(sizes, live, self.max_bytes)
        for name in plan.rotate:
            try:
                rotate(self.directory / name)
            except OSError as exc:
                log.warning("cannot rotate sandbox log %s: %s", name, exc)
        for name in plan.remove:
            try:
                remove(self.directory / name)
            except OSError as exc:
                log.warning("cannot remove sandbox log %s: %s", name, exc)
        return plan


__all__ = ["SandboxLogs"]
