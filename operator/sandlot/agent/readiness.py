"""The prober: runs each Running sandbox's readiness probe and keeps its ``Ready``
condition (``policy.readiness`` decides; this loop only probes and writes).

A pass every ``PROBE_TICK`` reads the node's Sandboxes from the sync's watch (no
request), asks ``decide_readiness`` for each one whose task runs and whose work
slot no step holds (``policy.lifecycle.probed``: not paused, not suspended, not
frozen for a commit or a snapshot; a result that came back while a step held the
slot is dropped) and hands a
probe that is due, or a verdict to write, to a small pool of its own: a slow
probe holds one of ``PROBE_WORKERS`` threads for its timeout at most, never the
pass nor the sync's workers. One item per sandbox is in flight at a time. After
each probe the verdict is taken again and written only on a transition, merged
into the conditions as last read (``meta.SetStatusCondition`` semantics) and only
while the sandbox is Running here. The results live in memory, a few per
sandbox; a restarted agent starts from the recorded condition.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sandlot.adapters.containerd.execs import open_execs
from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.adapters.statuswrite import WriteOutcome
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.proberun import ProbeRunner, handler_of
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.settings import AgentSettings
from sandlot.agent.status import StatusWriter
from sandlot.agent.streams import EXEC_FIFOS
from sandlot.api.common import key_of
from sandlot.api.probe import Probe
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import parse_time
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions
from sandlot.policy.readiness import (
    ProbeResult,
    ProbeTarget,
    Verdict,
    decide_readiness,
    history_length,
    probe_target,
)

log = logging.getLogger(__name__)

PROBE_TICK = 0.5  # seconds between passes: how late a due probe may start
PROBE_WORKERS = 8
RUNNING_ONLY = frozenset({SandboxPhase.RUNNING})

RunProbe = Callable[[str, Probe], tuple[bool, str]]  # (container id, probe) -> (passed, why)


@dataclass
class _Tracked:
    uid: str
    probe: Probe | None
    results: deque[ProbeResult] = field(default_factory=deque)
    written: bool | None = None  # what this agent wrote last, until the watch shows it


class ReadinessProber:
    def __init__(
        self,
        sandboxes: WatchCache,
        run_probe: RunProbe,
        status: StatusWriter,
        metrics: AgentMetrics,
        stop: threading.Event,
        slot_busy: Callable[[str], bool],
        workers: int = PROBE_WORKERS,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._close = close
        self.slot_busy = slot_busy
        """Whether a step holds a sandbox's work slot (``SandboxPools.busy``)."""
        self.sandboxes = sandboxes
        self.run_probe = run_probe
        self.status = status
        self.metrics = metrics
        self._stop = stop
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._busy: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe")

    def pass_once(self) -> None:
        if not self.sandboxes.synced.is_set():
            return
        now = self.status.clock()
        seen: set[str] = set()
        for obj in self.sandboxes.items():
            target = self._target(obj)
            if target is None:
                if self.slot_busy(key_of(obj)):  # its history outlives a step
                    seen.add(key_of(obj))
                continue
            seen.add(target.key)
            with self._lock:
                if target.key in self._busy:
                    continue
                verdict = self._verdict(target, now)
                due = verdict.next_probe_at is not None and verdict.next_probe_at <= now
                if verdict.write and self.status.held({target.key: _version(obj)}):
                    continue  # its last write failed: not again before the back-off ends
                if not (verdict.write or due):
                    continue
                self._busy.add(target.key)
            work = self._write if verdict.write else self._probe
            try:
                self._pool.submit(self._run, target.key, work, target)
            except RuntimeError:  # shut down
                with self._lock:
                    self._busy.discard(target.key)
                return
        with self._lock:
            for gone in [k for k in self._tracked if k not in seen]:
                del self._tracked[gone]
        self.metrics.readiness_passes.inc()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._close()

    # -- on the pool

    def _run(self, key: str, work: Callable[[ProbeTarget], None], target: ProbeTarget) -> None:
        try:
            if not self._stop.is_set():
                work(target)
        except Exception:
            log.exception("sandbox %s: readiness work failed", key)
        finally:
            with self._lock:
                self._busy.discard(key)

    def _probe(self, target: ProbeTarget) -> None:
        assert target.probe is not None, "only a probe is due"
        began = self.status.clock()
        passed, message = self.run_probe(target.container_id, target.probe)
        if self.slot_busy(target.key):  # a step froze or removed the task under the probe
            log.debug("sandbox %s: readiness probe dropped: a step holds the sandbox", target.key)
            return
        result = "success" if passed else "failure"
        self.metrics.readiness_probes.labels(handler_of(target.probe), result).inc()
        log.debug("sandbox %s: readiness probe %s: %s", target.key, result, message)
        with self._lock:
            tracked = self._track(target)
            tracked.results.append(ProbeResult(began, passed, message))
        self._write(target)

    def _write(self, target: ProbeTarget) -> None:
        """Write the verdict on the Sandbox as the watch shows it now, if it is news."""
        obj = self.sandboxes.get(target.key)
        current = self._target(obj) if obj is not None else None
        if obj is None or current is None or current.uid != target.uid:
            return  # ended, paused or replaced meanwhile: nothing to say about it
        with self._lock:
            verdict = self._verdict(current, self.status.clock())
        if not verdict.write:
            return
        outcome = self.status.write(obj, _merged(verdict, self.status), allowed_from=RUNNING_ONLY)
        log.info(
            "sandbox %s: Ready %s (%s): %s, %s",
            target.key,
            verdict.ready,
            verdict.reason,
            verdict.message,
            outcome,
        )
        if outcome is WriteOutcome.WRITTEN:
            with self._lock:
                self._track(current).written = verdict.ready

    def _target(self, obj: Mapping[str, Any]) -> ProbeTarget | None:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        container = status.get("containerId") or container_id_for(str(meta.get("uid") or ""))
        started = parse_time(status.get("startedAt"))
        return probe_target(obj, container, started, busy=self.slot_busy(key_of(obj)))

    # -- memory, under the lock

    def _track(self, target: ProbeTarget) -> _Tracked:
        tracked = self._tracked.get(target.key)
        if tracked is None or tracked.uid != target.uid or tracked.probe != target.probe:
            keep = history_length(target.probe) if target.probe is not None else 1
            tracked = _Tracked(target.uid, target.probe, deque(maxlen=keep))
            self._tracked[target.key] = tracked
        return tracked

    def _verdict(self, target: ProbeTarget, now: datetime) -> Verdict:
        """What ``decide_readiness`` says of ``target`` from its history (lock held)."""
        tracked = self._track(target)
        return decide_readiness(
            target.probe,
            target.started_at,
            self._recorded(target, tracked),
            tuple(tracked.results),
            now,
        )

    @staticmethod
    def _recorded(target: ProbeTarget, tracked: _Tracked) -> bool | None:
        """The recorded status, or what this agent wrote until the watch shows it (so
        a lagging watch does not ask for the same write twice)."""
        if tracked.written is None or target.recorded == tracked.written:
            tracked.written = None
            return target.recorded
        return tracked.written


def readiness_prober(
    settings: AgentSettings,
    sandboxes: WatchCache,
    status: StatusWriter,
    metrics: AgentMetrics,
    stop: threading.Event,
    slot_busy: Callable[[str], bool],
) -> ReadinessProber:
    """The node's prober, its execs on a containerd channel of their own; ``slot_busy``
    says whether a step holds a sandbox's work slot."""
    runner = ProbeRunner(
        lambda: open_execs(
            settings.containerd_address,
            settings.containerd_namespace,
            os.path.join(settings.state_dir, EXEC_FIFOS),
        ),
        proc_root=settings.proc_root,
        call_timeout=settings.call_timeout.total_seconds(),
    )
    return ReadinessProber(
        sandboxes, runner.run, status, metrics, stop, slot_busy, close=runner.close
    )


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _merged(
    verdict: Verdict, status: StatusWriter
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    condition = verdict.condition()

    def merged(current: Mapping[str, Any]) -> dict[str, Any]:
        existing = parse_conditions((current.get("status") or {}).get("conditions"))
        return {"conditions": wire_conditions(set_condition(existing, condition, status.clock()))}

    return merged


__all__ = ["PROBE_TICK", "ReadinessProber", "RunProbe", "readiness_prober"]
