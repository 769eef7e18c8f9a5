"""Moving a suspended sandbox to another node: pure.

A sandbox whose filesystem was committed and pushed (``status.suspendedState``)
no longer needs its node: any node may pull that state and start it again. The
scheduler moves it (binds it to another node, ``spec.nodeName`` rewritten under
the resourceVersion; the CRD allows that only while the state is recorded) when
its node can no longer start it: cordoned (a drain), not Ready, or gone. The
move keeps its operating mode: a sandbox still ``Suspended`` waits on its new
node, one asked to run again starts there (its new node's agent pulls the state
first), and its address is the new node's, which routing reads from its status.

A sandbox whose node is Ready stays: it starts again there from the local image,
without a pull. A lost node's sandboxes are marked Dead, but for these: their
state is safe elsewhere, and the scheduler moves them when node health would have
marked them Dead, not before: once the node's episode is handled (its grace over,
the mass-failure guard not holding). A NotReady node may be only cut off from the
API server, its agent alive: a move before then would let two nodes run the sandbox.
A cordoned (Disabled) node is a drain, which moves them at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sandlot.api.node import NodePhase
from sandlot.api.reasons import ConditionType
from sandlot.api.sandbox import SandboxPhase


def state_movable(
    phase: str, conditions: Iterable[tuple[str, str, str]], state_node: str | None
) -> bool:
    """Running (its claim and spec its own), its Suspended condition True, its state
    pushed: it may be started on any node."""
    suspended = any(t == ConditionType.SUSPENDED and s == "True" for t, s, _ in conditions)
    return phase == SandboxPhase.RUNNING and suspended and state_node is not None


def movable_object(obj: Mapping[str, Any]) -> bool:
    """``state_movable`` of a Sandbox as the API server gives it: a lost node's
    marking leaves such a sandbox to the scheduler, which moves it."""
    status = obj.get("status") or {}
    conditions = [
        (str(c.get("type")), str(c.get("status")), str(c.get("reason")))
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping)
    ]
    state = status.get("suspendedState") or {}
    return state_movable(str(status.get("phase")), conditions, state.get("node"))


def move_wanted(movable: bool, node_phase: NodePhase | None, handled: bool) -> bool:
    """Whether to bind a sandbox to another node: it is ``movable`` and its node
    (``node_phase``, None when it is gone) cannot start it: cordoned, gone, or
    NotReady and ``handled`` by node health (``policy.nodehealth.episode_handled``:
    past its grace, not held by the guard), as a Dead marking would wait."""
    if not movable or node_phase is NodePhase.READY:
        return False
    if node_phase is NodePhase.NOT_READY:
        return handled
    return True


def restore_refusal(current: Mapping[str, Any] | None, uid: str, node: str) -> str | None:
    """Why ``node`` must not start again the sandbox of ``uid`` its watch showed as its
    own, now that a fresh read gives ``current`` (None: deleted); None when it may.
    A sandbox moved to another node (``spec.nodeName``) is that node's to restore."""
    if current is None:
        return "it was deleted"
    meta, spec = current.get("metadata") or {}, current.get("spec") or {}
    if meta.get("uid") != uid:
        return "it was deleted (another sandbox has its name)"
    if spec.get("nodeName") != node:
        return f"it was moved to node {spec.get('nodeName')}"
    return None


__all__ = ["movable_object", "move_wanted", "restore_refusal", "state_movable"]
