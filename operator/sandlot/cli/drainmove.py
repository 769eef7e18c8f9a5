"""``sandlot drain --move NODE``: drain a node keeping its sandboxes' work.

Each non-terminal sandbox of the node is asked to suspend, the node is cordoned,
and the drain follows each one (``policy.drainmove.next_step``) until it runs
again elsewhere or has ended, within one deadline; it gives each moved sandbox
back its mode and prints one line per sandbox as it settles. Exit 0 when every
sandbox moved, 1 otherwise (one ended, or the deadline passed: what is left is
named with what it waits for).
"""

from __future__ import annotations

import time

from sandlot.adapters.nodes import read_sandbox as _read
from sandlot.adapters.nodes import set_operating_mode as _set_mode
from sandlot.adapters.nodes import set_unschedulable
from sandlot.adapters.objects import Objects
from sandlot.api.common import key_of
from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode
from sandlot.policy.drainmove import MoveStep, next_step, waiting_for

POLL_INTERVAL = 0.5


def _suspend_all(objects: Objects, node: str) -> dict[str, str]:
    """Ask every live sandbox of ``node`` to suspend; their modes before, by key."""
    original: dict[str, str] = {}
    for sb in objects.list_node_sandboxes(node):
        if (sb.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        key = key_of(sb)
        original[key] = (sb.get("spec") or {}).get("operatingMode") or OperatingMode.RUNNING
        if original[key] != OperatingMode.SUSPENDED:
            _set_mode(objects, key, OperatingMode.SUSPENDED)
    return original


def drain_move(objects: Objects, node: str, timeout: float, timeout_text: str) -> int:
    original = _suspend_all(objects, node)
    set_unschedulable(objects, node, True)
    print(
        f"node {node} cordoned; {len(original)} sandboxes asked to suspend and move",
        flush=True,
    )
    deadline = time.monotonic() + timeout
    left, moved = dict(original), 0
    while left:
        for key in sorted(left):
            sb = _read(objects, key)
            outcome = next_step(sb, node, left[key])
            if outcome.step is MoveStep.RESTORE_MODE:
                _set_mode(objects, key, left[key])
            elif outcome.step is MoveStep.DONE:
                print(f"{key}: {outcome.message}", flush=True)
                moved += outcome.moved
                del left[key]
        if left and time.monotonic() >= deadline:
            for key in sorted(left):
                print(f"{key}: not moved: waits for {waiting_for(_read(objects, key), node)}")
            print(
                f"sandlot: drain --move of {node} timed out after {timeout_text}: "
                f"{len(left)} sandboxes left",
                flush=True,
            )
            return 1
        if left:
            time.sleep(min(POLL_INTERVAL, max(deadline - time.monotonic(), 0.05)))
    print(f"node {node} drained: {moved} of {len(original)} sandboxes moved", flush=True)
    return 0 if moved == len(original) else 1


__all__ = ["drain_move"]
