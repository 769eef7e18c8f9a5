"""Tearing a container down without ever waiting unbounded.

A dead or wedged containerd shim never delivers its task's exit event. An
unbounded wait for that event once hung a node's start-up forever: the orphan
sweep runs before the node heartbeats, so one leftover container with a stopped
shim kept the whole node out of service. Here the exit wait is capped by
``kill_wait`` and every other containerd call by ``call_timeout``; when the exit
does not come, a warning names the container and the teardown goes on (delete
task, container, snapshot, each with its own deadline). A ``NotFound`` at any step
means that step's work is already done. A task that cannot be deleted, or whose presence
cannot be told (its lookup failed), keeps its container record, so the container stays visible to
the next sweep instead of
leaving a shim and process nobody can find.

A sandbox with its own network (CNI) is detached by the ``release`` hook once its
task is gone and before its container record goes: the record's labels are what
the hook needs, so a failed release (a plugin erring or timing out) keeps the
record for the next pass, like a task that cannot be deleted, and the address is
never leaked.

The worst case of one teardown is therefore ``kill_wait + 4 * call_timeout`` (plus
the release hook's own bound); a graceful stop adds its grace, a SIGTERM and the
look at the task before it (two calls, three when a paused task is thawed first:
a frozen process takes no SIGTERM, and its grace would pass unseen). SIGKILL needs
no thaw: runc thaws a frozen cgroup v1 task it kills, and v2's freezer lets a
fatal signal through. ``teardown_many`` runs teardowns on a pool of
``concurrency`` threads: because every call returns by its deadline, no thread is
ever left behind by a wedged shim, so threads (and gRPC streams) never grow with
the number of wedged containers.
"""

from __future__ import annotations

import logging
import signal as signals
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from sandlot.adapters.runtime import (
    ContainerInfo,
    ExitStatus,
    NotFound,
    Runtime,
    RuntimeError_,
    RuntimeTimeout,
)
from sandlot.policy.operatingmode import FROZEN

log = logging.getLogger(__name__)

GRACE_SLICE = 5.0
"""Longest single wait of a graceful stop: how soon a stopping agent lets go of it."""

Release = Callable[[ContainerInfo | str], object]
"""Frees what a container holds outside containerd (its network); raises on failure."""


class TeardownOutcome(StrEnum):
    CLEAN = "clean"
    """Every step done (or found already done)."""
    KILL_WAIT_TIMEOUT = "kill_wait_timeout"
    """The exit never came within kill_wait; the deletes were still attempted."""
    ERROR = "error"
    """A delete step failed; something may be left behind for the next sweep."""


@dataclass(frozen=True)
class TeardownResult:
    container_id: str
    outcome: TeardownOutcome
    exit_status: ExitStatus | None = None
    """The task's exit, when it was seen (wait or task delete)."""
    errors: tuple[str, ...] = ()
    elapsed: float = 0.0


@dataclass
class _Steps:
    container_id: str
    errors: list[str] = field(default_factory=list)

    def call(self, what: str, fn: Callable[[], object]) -> object | None:
        """Run one bounded step; NotFound is success, other errors are recorded."""
        try:
            return fn()
        except NotFound:
            return None
        except RuntimeError_ as exc:
            self.errors.append(f"{what}: {exc}")
            return None


def _key(container: ContainerInfo | str) -> tuple[str, str]:
    if isinstance(container, ContainerInfo):
        return container.id, container.snapshot_key or container.id
    return container, container


@dataclass
class _TaskEnd:
    exit_status: ExitStatus | None = None
    timed_out: bool = False
    """No exit came within kill_wait."""
    gone: bool = True
    """The task is deleted (or never existed): the container may go."""


def _end_task(
    runtime: Runtime,
    container_id: str,
    steps: _Steps,
    *,
    signal: int,
    kill_wait: float,
    call_timeout: float,
) -> _TaskEnd:
    """Kill, wait at most ``kill_wait`` for the exit, delete the task."""
    end = _TaskEnd()
    has_task = True
    try:
        runtime.kill_task(container_id, signal, timeout=call_timeout)
    except NotFound:
        # No task, or its process already finished: containerd says so with NotFound.
        # Only a clean answer of "no task" lets the container go: a lookup that fails
        # (a wedged shim, containerd busy) counts as a task that may be alive.
        try:
            has_task = runtime.get_task(container_id, timeout=call_timeout) is not None
        except RuntimeError_ as exc:
            log.warning("container %s: cannot tell whether its task lives: %s", container_id, exc)
            steps.errors.append(f"get task: {exc}")
            end.gone = False
            return end
    except RuntimeTimeout as exc:
        log.warning("container %s: kill got no answer: %s", container_id, exc)
    except RuntimeError_ as exc:
        log.info("container %s: kill failed (%s); waiting for its exit anyway", container_id, exc)
    if not has_task:
        return end
    try:
        end.exit_status = runtime.wait_task(container_id, timeout=kill_wait)
    except NotFound:
        pass
    except RuntimeTimeout:
        end.timed_out = True
        log.warning(
            "container %s: no exit within kill wait of %gs (dead or wedged shim?); "
            "deleting it anyway",
            container_id,
            kill_wait,
        )
    except RuntimeError_ as exc:
        steps.errors.append(f"wait: {exc}")
    failures = len(steps.errors)
    deleted = steps.call(
        "delete task", lambda: runtime.delete_task(container_id, timeout=call_timeout)
    )
    if isinstance(deleted, ExitStatus) and end.exit_status is None:
        end.exit_status = deleted
    end.gone = len(steps.errors) == failures
    return end


def _remove(
    runtime: Runtime,
    container: ContainerInfo | str,
    steps: _Steps,
    *,
    call_timeout: float,
    release: Release | None,
) -> None:
    """Release the network, then delete the container and its snapshot."""
    container_id, snapshot_key = _key(container)
    if release is not None:
        try:
            release(container)
        except Exception as exc:
            # Keep the record: its labels say what to release on the next pass.
            steps.errors.append(f"release network: {exc}: container kept for the next pass")
            return
    steps.call(
        "delete container",
        lambda: runtime.delete_container(container_id, timeout=call_timeout),
    )
    steps.call(
        "remove snapshot", lambda: runtime.remove_snapshot(snapshot_key, timeout=call_timeout)
    )


def teardown(
    runtime: Runtime,
    container: ContainerInfo | str,
    *,
    kill_wait: float,
    call_timeout: float,
    signal: int = signals.SIGKILL,
    on_done: Callable[[TeardownResult], object] | None = None,
    release: Release | None = None,
) -> TeardownResult:
    """Kill, wait at most ``kill_wait`` for the exit, then delete task, ``release`` the
    network, delete container and snapshot."""
    began = time.monotonic()
    container_id, _ = _key(container)
    steps = _Steps(container_id)
    end = _end_task(
        runtime, container_id, steps, signal=signal, kill_wait=kill_wait, call_timeout=call_timeout
    )
    if end.gone:
        _remove(runtime, container, steps, call_timeout=call_timeout, release=release)
    else:
        # containerd would drop the record of a container whose task still lives, and the
        # task (shim and process) would then be invisible to every later sweep. Keeping the
        # record leaves it an orphan that the next sweep tears down once the shim answers.
        steps.errors.append("task still present: container kept for the next sweep")

    if end.timed_out:
        outcome = TeardownOutcome.KILL_WAIT_TIMEOUT
    elif steps.errors:
        outcome = TeardownOutcome.ERROR
    else:
        outcome = TeardownOutcome.CLEAN
    if steps.errors:
        log.warning("container %s: teardown incomplete: %s", container_id, "; ".join(steps.errors))
    result = TeardownResult(
        container_id,
        outcome,
        exit_status=end.exit_status,
        errors=tuple(steps.errors),
        elapsed=time.monotonic() - began,
    )
    if on_done is not None:
        on_done(result)
    return result


class StopInterrupted(Exception):
    """The agent is stopping: a graceful stop was left to the next agent."""


def _wait_graceful(
    runtime: Runtime,
    container_id: str,
    stop_grace: float,
    cancel: threading.Event | None,
) -> ExitStatus | None:
    """Wait up to ``stop_grace`` for the exit, in slices so ``cancel`` ends it early
    (a grace can be an hour; the agent's own shutdown must not wait for it)."""
    deadline = time.monotonic() + stop_grace
    while True:
        if cancel is not None and cancel.is_set():
            raise StopInterrupted(container_id)
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeTimeout(f"no exit within {stop_grace:g}s of SIGTERM")
        try:
            return runtime.wait_task(container_id, timeout=min(left, GRACE_SLICE))
        except RuntimeTimeout:
            if time.monotonic() >= deadline:
                raise


def _thaw(runtime: Runtime, container_id: str, call_timeout: float) -> None:
    """Resume a paused task so that its SIGTERM is seen; any failure leaves it to the
    SIGKILL after the grace."""
    try:
        task = runtime.get_task(container_id, timeout=call_timeout)
        if task is not None and task.state in FROZEN:
            log.info("container %s: paused; resuming it so that it sees SIGTERM", container_id)
            runtime.resume_task(container_id, timeout=call_timeout)
    except RuntimeError_ as exc:
        log.info("container %s: cannot resume it before SIGTERM: %s", container_id, exc)


def stop(
    runtime: Runtime,
    container: ContainerInfo | str,
    *,
    stop_grace: float,
    kill_wait: float,
    call_timeout: float,
    on_done: Callable[[TeardownResult], object] | None = None,
    release: Release | None = None,
    cancel: threading.Event | None = None,
) -> TeardownResult:
    """SIGTERM (a paused task thawed first), up to ``stop_grace`` for the exit, then
    the bounded teardown (SIGKILL).

    Raises ``StopInterrupted`` when ``cancel`` is set during the grace: the task got
    its SIGTERM and is left running for the next agent, which stops it again.
    """
    container_id, _ = _key(container)
    graceful: ExitStatus | None = None
    _thaw(runtime, container_id, call_timeout)
    try:
        runtime.kill_task(container_id, signals.SIGTERM, timeout=call_timeout)
        if stop_grace > 0:
            graceful = _wait_graceful(runtime, container_id, stop_grace, cancel)
    except NotFound:
        pass
    except RuntimeTimeout:
        log.info("container %s: still running %gs after SIGTERM; killing", container_id, stop_grace)
    except RuntimeError_ as exc:
        log.info("container %s: SIGTERM failed (%s); killing", container_id, exc)
    result = teardown(
        runtime,
        container,
        kill_wait=kill_wait,
        call_timeout=call_timeout,
        on_done=None,
        release=release,
    )
    if graceful is not None and result.exit_status is None:
        result = TeardownResult(
            result.container_id, result.outcome, graceful, result.errors, result.elapsed
        )
    if on_done is not None:
        on_done(result)
    return result


def teardown_many(
    runtime: Runtime,
    containers: Sequence[ContainerInfo | str],
    *,
    kill_wait: float,
    call_timeout: float,
    concurrency: int,
    on_done: Callable[[TeardownResult], object] | None = None,
    release: Release | None = None,
) -> list[TeardownResult]:
    """Tear ``containers`` down, at most ``concurrency`` at a time; results in input order.

    With ``n`` containers of which ``w`` are wedged, this takes about
    ``ceil(w / concurrency)`` teardown bounds plus the clean ones' time, never ``w``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not containers:
        return []
    with ThreadPoolExecutor(
        max_workers=min(concurrency, len(containers)), thread_name_prefix="teardown"
    ) as pool:
        return list(
            pool.map(
                lambda c: teardown(
                    runtime,
                    c,
                    kill_wait=kill_wait,
                    call_timeout=call_timeout,
                    on_done=on_done,
                    release=release,
                ),
                containers,
            )
        )
