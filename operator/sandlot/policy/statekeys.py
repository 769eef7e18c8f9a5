"""Which node may hold which state key: the keys that seal pushed state.

Every sandbox's suspended state is sealed under a key of its own, and every
pushed snapshot under one of its own (``adapters.pulling.sealed``); the operator
keeps them and brokers to a node only the keys of what that node runs now:

- a non-terminal Sandbox whose ``spec.nodeName`` is the node: its own key (to push
  its state when it suspends, to pull it when it resumes there after a move);
- a snapshot such a sandbox forks from, once pushed: that snapshot's key (to pull
  it);
- a SandboxSnapshot bound to the node (``spec.nodeName``) and not yet Ready or
  Failed: its key (to push it).

Nothing else: a node that held a sandbox before a move loses its key at the next
brokering, and a compromised node reads only what it runs. A key lives as long
as its owner does; the owner gone, the key goes (``orphaned_keys``), and with it
every copy of the state any registry kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.api.snapshot import TERMINAL_SNAPSHOT_PHASES

KEY_SECRET_PREFIX = "sandlot-state-key-"
BROKERED_PREFIX = "_state."


def key_secret_name(owner: str) -> str:
    """The operator's Secret (its own namespace) holding the key of ``owner`` (a uid)."""
    return f"{KEY_SECRET_PREFIX}{owner}"


def owner_of_secret(name: str) -> str | None:
    """The owner uid a key Secret's name names; None for another Secret."""
    return name[len(KEY_SECRET_PREFIX) :] if name.startswith(KEY_SECRET_PREFIX) else None


def brokered_key(owner: str) -> str:
    """The key of ``owner``'s state key in its node's brokered Secret (no namespace
    starts with ``_`` and no other brokered kind is ``state``)."""
    return f"{BROKERED_PREFIX}{owner}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def node_keys(
    node: str, sandboxes: Iterable[Mapping[str, Any]], snapshots: Iterable[Mapping[str, Any]]
) -> frozenset[str]:
    """The owners (uids) whose state keys ``node`` may hold now."""
    snapshots = list(snapshots)
    pushed = {
        (str(_meta(s).get("namespace")), str(_meta(s).get("name"))): str(_meta(s).get("uid"))
        for s in snapshots
        if _status(s).get("pushedImage") and _meta(s).get("uid")
    }
    owners: set[str] = set()
    for sb in sandboxes:
        if _spec(sb).get("nodeName") != node or _status(sb).get("phase") in TERMINAL_PHASES:
            continue
        if _meta(sb).get("uid"):
            owners.add(str(_meta(sb)["uid"]))
        fork = (_spec(sb).get("snapshotRef") or {}).get("name")
        source = pushed.get((str(_meta(sb).get("namespace")), str(fork))) if fork else None
        if source is not None:
            owners.add(source)
    for shot in snapshots:
        if (
            _spec(shot).get("nodeName") == node
            and _status(shot).get("phase") not in TERMINAL_SNAPSHOT_PHASES
            and _meta(shot).get("uid")
        ):
            owners.add(str(_meta(shot)["uid"]))
    return frozenset(owners)


def orphaned_keys(
    owners: Iterable[str],
    sandboxes: Iterable[Mapping[str, Any]],
    snapshots: Iterable[Mapping[str, Any]],
) -> list[str]:
    """The ``owners`` whose Sandbox or SandboxSnapshot no longer exists (read after
    the keys were listed): their keys go, and their state is unreadable anywhere."""
    live = {str(_meta(o).get("uid")) for o in [*sandboxes, *snapshots]}
    return sorted(o for o in owners if o not in live)


__all__ = [
    "BROKERED_PREFIX",
    "KEY_SECRET_PREFIX",
    "brokered_key",
    "key_secret_name",
    "node_keys",
    "orphaned_keys",
    "owner_of_secret",
]
