"""The reaper: containers whose task provably exited are torn down and their Sandbox
ended with the exit code (``policy.agentreap`` says which end).

Only a task containerd reports as stopped is touched: a running task, a task in
an unknown state (a silent shim) and a container never started are left alone.
The Sandbox is read first, in the sandbox's work slot: a suspended one
(``policy.lifecycle.reaper_leaves``) keeps its container for the sync's REMOVE
step and is not ended; one that cannot be read has its container torn down and
is not ended.
The OOM counter is read before the teardown, which removes the cgroup holding it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from sandlot.adapters.nodeguard import oom_kills
from sandlot.adapters.objects import Objects
from sandlot.adapters.runtime import ContainerInfo, Runtime, TaskInfo, TaskState
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.sandboxes import SandboxWork
from sandlot.agent.status import StatusWriter
from sandlot.agent.workpools import SandboxPools
from sandlot.api.common import split_key
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.policy.agentreap import decide_reap
from sandlot.policy.agentsync import SandboxState
from sandlot.policy.lifecycle import reaper_leaves
from sandlot.policy.ocispec import cgroups_path_for

log = logging.getLogger(__name__)


class Reaper:
    def __init__(
        self,
        objects: Objects,
        rt: Runtime,
        pool: SandboxPools,
        work: SandboxWork,
        status: StatusWriter,
        metrics: AgentMetrics,
        *,
        cgroup_root: str,
        call_timeout: float,
    ) -> None:
        self.objects = objects
        self.rt = rt
        self.pool = pool
        self.work = work
        self.status = status
        self.metrics = metrics
        self.cgroup_root = cgroup_root
        self.call_timeout = call_timeout

    def reap_once(self) -> int:
        """Tear down containers whose task provably exited; end their Sandboxes. Returns count."""
        rt = self.rt
        self.metrics.reaper_passes.inc()
        tasks = {t.container_id: t for t in rt.list_tasks(timeout=self.call_timeout)}
        containers = rt.list_containers(timeout=self.call_timeout)
        reaped = 0
        for c in containers:
            task = tasks.get(c.id)
            if task is None or task.state != TaskState.STOPPED:
                continue  # running, unknown (a silent shim), or not started: never touched
            sandbox = c.labels.get(SANDBOX_LABEL) or None
            key = sandbox or f"container/{c.id}"
            if self.pool.submit(key, partial(self._reap, sandbox, c, task)):
                reaped += 1
        return reaped

    def _oom_kills(self, container_id: str) -> int | None:
        try:
            parent = self.work.settings.cgroup_parent
            return oom_kills(self.cgroup_root, cgroups_path_for(container_id, parent))
        except Exception as exc:  # a guess about the reason must never stop the reaper
            log.warning("cannot read the OOM counter of %s: %s", container_id, exc)
            return None

    def _read(self, sandbox: str | None) -> Mapping[str, Any] | None:
        """The Sandbox (None: unlabelled, gone, or unreadable: then torn down, not ended)."""
        if sandbox is None or "/" not in sandbox:
            return None
        try:
            return self.objects.find_sandbox(*split_key(sandbox))
        except Exception as exc:
            log.warning("reaper: cannot read sandbox %s: %s", sandbox, exc)
            return None

    def _reap(self, sandbox: str | None, container: ContainerInfo, task: TaskInfo) -> None:
        obj = self._read(sandbox)
        state = SandboxState.from_object(obj) if obj is not None else None
        if state is not None and reaper_leaves(state.held):
            log.info(
                "reaper: %s is suspended: container %s is its commit's leftover, "
                "removed by the sync, and the sandbox is not ended",
                sandbox,
                container.id,
            )
            return
        # Before the teardown: deleting the task removes the cgroup and its counter.
        oom = self._oom_kills(container.id)
        result = self.work.teardown(container)
        self.metrics.reaped.inc()
        code = task.exit_status
        if code is None and result.exit_status is not None:
            code = result.exit_status.code
        log.info(
            "reaper: container %s of %s exited with %s",
            container.id,
            sandbox or f"container/{container.id}",
            code,
        )
        if obj is None:
            return
        end = decide_reap(state, container.id, code, oom)
        if end is not None:
            self.status.end(obj, end.phase, end.reason, end.message, end.exit_code)


__all__ = ["Reaper"]
