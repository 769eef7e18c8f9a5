"""How a sandbox ends when its task exited on its own: a pure decision for the reaper.

The reaper tears down a container whose task provably stopped, then ends its
Sandbox with the exit code. Which end depends on how far the sandbox got and on
the kernel's OOM counter of its cgroup (read before the teardown removed it):

- OOM-killed: ``OOMKilled``; Stopped if it was Running, Failed if it never got there.
- Running: ``Stopped``/``Exited`` (a process that ends is a sandbox that ends).
- not yet Running: ``Failed``/``ExitedBeforeRunning`` (it exited before its start
  was recorded, so it never served).
- nothing when the Sandbox is terminal already (its end is written), unreadable,
  or records another container (this one was a leftover, not the sandbox's).
- nothing, and its container left alone, when the lifecycle says it is suspended
  (``policy.lifecycle.reaper_leaves``): a suspend whose task delete failed leaves
  a stopped task behind, the commit's leftover that the sync's REMOVE step removes;
  the sandbox lives on in its committed state.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.policy.agentsync import SandboxState
from sandlot.policy.lifecycle import reaper_leaves


@dataclass(frozen=True)
class SandboxEnd:
    """The terminal status to write."""

    phase: SandboxPhase
    reason: str
    message: str
    exit_code: int | None


def decide_reap(
    sandbox: SandboxState | None,
    container_id: str,
    exit_code: int | None,
    oom_kills: int | None,
) -> SandboxEnd | None:
    """The end of ``sandbox`` whose container ``container_id`` exited with ``exit_code``
    (None: unknown); ``oom_kills`` is its cgroup's OOM-kill count (None: unreadable)."""
    if sandbox is None or sandbox.phase in TERMINAL_PHASES or reaper_leaves(sandbox.held):
        return None
    if sandbox.container_id not in (None, container_id):
        return None
    running = sandbox.phase is SandboxPhase.RUNNING
    if oom_kills:
        return SandboxEnd(
            SandboxPhase.STOPPED if running else SandboxPhase.FAILED,
            SandboxReason.OOM_KILLED,
            f"killed by the kernel for exceeding its memory limit (exit code {exit_code})",
            exit_code,
        )
    if running:
        return SandboxEnd(
            SandboxPhase.STOPPED, SandboxReason.EXITED, f"exited with code {exit_code}", exit_code
        )
    return SandboxEnd(
        SandboxPhase.FAILED,
        SandboxReason.EXITED_BEFORE_RUNNING,
        f"exited with code {exit_code}",
        exit_code,
    )


__all__ = ["SandboxEnd", "decide_reap"]
