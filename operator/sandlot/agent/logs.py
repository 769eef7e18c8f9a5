"""The sandbox-log pass: attach the output FIFOs of running containers the agent
is not reading (after a restart), detach those whose container is gone, and remove
the files of sandboxes gone or ended (``policy.sandboxlogs`` decides; whose logs
stay is the lifecycle's answer, ``policy.lifecycle.logs_kept``, over the node's
watched Sandboxes)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandlot.adapters.logfiles import fifo_stems, log_files, remove
from sandlot.adapters.runtime import Runtime
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.agent.logwriter import LogWriter
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.settings import AgentSettings
from sandlot.api.keys import SANDBOX_UID_LABEL
from sandlot.policy.lifecycle import held_here, logs_kept
from sandlot.policy.sandboxlogs import LogPlan, plan_logs

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SandboxLogs:
    writer: LogWriter | None
    rt: Runtime
    call_timeout: float
    node: str
    sandboxes: WatchCache
    """The node's Sandboxes, as the sync watches them."""
    passes: Callable[[], object]

    def _kept(self) -> frozenset[str] | None:
        """The uids whose logs stay; None until the watch has listed."""
        if not self.sandboxes.synced.is_set():
            return None
        return frozenset(
            str(o["metadata"]["uid"])
            for o in self.sandboxes.items()
            if logs_kept(held_here(o, self.node))
        )

    def pass_once(self) -> LogPlan:
        writer = self.writer
        if writer is None:
            return LogPlan()
        # Every listing before the containers': see plan_logs.
        attached = writer.attached()
        fifos = fifo_stems(writer.fifo_dir)
        files = log_files(writer.log_dir)
        containers = self.rt.list_containers(timeout=self.call_timeout)
        live = {c.labels.get(SANDBOX_UID_LABEL, "") for c in containers} - {""}
        plan = plan_logs(files, fifos, attached, live, self._kept())
        for stem in plan.attach:
            try:
                writer.attach(stem)
            except OSError as exc:
                log.warning("cannot read the output of %s: %s", stem, exc)
        for stem, token in plan.detach.items():
            try:
                writer.detach(stem, token)
            except OSError as exc:
                log.warning("cannot detach the output of %s: %s", stem, exc)
        for name in plan.remove:
            try:
                remove(writer.log_dir / name)
            except OSError as exc:
                log.warning("cannot remove sandbox log %s: %s", name, exc)
        self.passes()
        return plan


def sandbox_logs(
    settings: AgentSettings,
    rt: Runtime,
    call_timeout: float,
    metrics: AgentMetrics,
    sandboxes: WatchCache,
) -> SandboxLogs:
    """The pass over ``settings``' log directory, with its writer (none when logs
    are not kept). The FIFOs live under the state directory, on the node's disk, in a
    directory of this node's own: the pass unlinks every FIFO there whose container
    it does not find, so no other agent's may be there (agents of several nodes
    share one host, and one state directory, in the test rig and the demo)."""
    writer = None
    if settings.log_dir:
        fifos = Path(settings.state_dir) / "logs" / settings.node_name
        dropped = metrics.log_bytes_dropped.inc
        writer = LogWriter(settings.log_dir, fifos, settings.log_max_bytes, dropped=dropped)
    passes = metrics.log_passes.inc
    return SandboxLogs(writer, rt, call_timeout, settings.node_name, sandboxes, passes)


__all__ = ["SandboxLogs", "sandbox_logs"]
