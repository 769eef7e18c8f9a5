"""``Snapshot``: a sandbox's filesystem at one moment, to start others from.

``Sandbox.snapshot`` makes a SandboxSnapshot and returns once its node's agent has
taken it (``Ready``) or said why not (``Failed``, raised as ``CommandError``);
``Client.create(..., snapshot=...)`` starts a sandbox from one ("fork"). A wait that
fails deletes the snapshot it made, so a failed call leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sandlot.adapters.sandboxapi import ApiRefused, SandboxApi
from sandlot.api.common import GROUP, SNAPSHOTS, VERSION
from sandlot.api.snapshot import SnapshotPhase
from sandlot.client.errors import CommandError, TimedOut
from sandlot.client.refusals import refusal

SNAPSHOT_TIMEOUT = 300.0  # seconds: the commit of a large writable layer comes first


def snapshot_outcome(body: Mapping[str, Any] | None) -> str | None:
    """``"ready"``, why it failed or is gone, or None while it is still being taken."""
    if body is None:
        return "it was deleted"
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase == SnapshotPhase.READY:
        return "ready"
    if phase == SnapshotPhase.FAILED:
        said = ": ".join(str(status[k]) for k in ("reason", "message") if status.get(k))
        return f"it failed ({said or 'no reason given'})"
    return None


def _last_seen(body: Mapping[str, Any] | None) -> str:
    status = (body or {}).get("status") or {}
    node = ((body or {}).get("spec") or {}).get("nodeName")
    said = [f"phase {status.get('phase') or 'Pending'}"]
    said.append(f"node {node}" if node else "not bound to a node yet (is the operator up?)")
    if status.get("message"):
        said.append(str(status["message"]))
    return "; ".join(said)


class Snapshot:
    """A SandboxSnapshot in ``namespace``; from ``Sandbox.snapshot`` or ``Client.snapshot``."""

    def __init__(self, api: SandboxApi, body: Mapping[str, Any]) -> None:
        self._api = api
        self.body = dict(body)
        self.name: str = body["metadata"]["name"]
        self.namespace: str = body["metadata"]["namespace"]

    def __repr__(self) -> str:
        return f"Snapshot({self.namespace}/{self.name}, {self.phase})"

    @property
    def _status(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}

    @property
    def phase(self) -> str:
        return str(self._status.get("phase") or SnapshotPhase.PENDING)

    @property
    def sandbox(self) -> str:
        """The sandbox it was taken of."""
        return str((self.body.get("spec") or {}).get("sandboxName") or "")

    @property
    def node(self) -> str | None:
        """The node that keeps it: forks of it run there."""
        return (self.body.get("spec") or {}).get("nodeName")

    @property
    def digest(self) -> str | None:
        return self._status.get("digest")

    @property
    def pushed_image(self) -> str | None:
        """Where its node's state repository keeps a copy (``repository:tag@digest``),
        None when its node has none: then forks of it run on its node only."""
        return self._status.get("pushedImage")

    @property
    def size_bytes(self) -> int | None:
        """Bytes it adds to its sandbox's image (the committed writable layer)."""
        return self._status.get("sizeBytes")

    def refresh(self) -> Snapshot:
        try:
            self.body = self._api.get(SNAPSHOTS, self.namespace, self.name)
        except ApiRefused as e:
            raise refusal(e, self.namespace, self.name, "snapshot") from None
        return self

    def delete(self) -> None:
        """Delete it; it is kept (its deletion pending) while a sandbox forks from it.
        One already gone is no error."""
        try:
            self._api.delete(SNAPSHOTS, self.namespace, self.name)
        except ApiRefused as e:
            raise refusal(e, self.namespace, self.name, "snapshot") from None


def take_snapshot(
    api: SandboxApi, namespace: str, sandbox: str, name: str | None, timeout: float
) -> Snapshot:
    """A new SandboxSnapshot of ``sandbox``, once Ready (see the module's docstring)."""
    deadline = time.monotonic() + timeout
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxSnapshot",
        "metadata": {"name": name} if name else {"generateName": f"{sandbox[:40]}-"},
        "spec": {"sandboxName": sandbox},
    }
    try:
        made = api.create(SNAPSHOTS, namespace, body)
    except ApiRefused as e:
        raise refusal(e, namespace, name or "(new)", "snapshot") from None
    made_name = made["metadata"]["name"]
    seen: list[dict[str, Any] | None] = [made]

    def settled(current: dict[str, Any] | None) -> bool:
        seen[0] = current
        return snapshot_outcome(current) is not None

    what = f"snapshot {namespace}/{made_name} of sandbox {sandbox}"
    try:
        final = api.wait(SNAPSHOTS, namespace, made_name, settled, deadline)
    except TimeoutError:
        released = _release(api, namespace, made_name)
        raise TimedOut(
            f"{what}: not taken within {timeout:.0f}s ({_last_seen(seen[0])}); {released}"
        ) from None
    except BaseException:
        _release(api, namespace, made_name)
        raise
    outcome = snapshot_outcome(final)
    if outcome != "ready":
        raise CommandError(f"{what}: {outcome}; {_release(api, namespace, made_name)}")
    assert final is not None  # ready
    return Snapshot(api, final)


def _release(api: SandboxApi, namespace: str, name: str) -> str:
    """Delete the snapshot a failed call made; what became of it, for its error."""
    try:
        api.delete(SNAPSHOTS, namespace, name)
    except ApiRefused as e:  # the caller's own error goes on: this one is named in it
        return f"and it could not be deleted ({e})"
    return "it was deleted"


__all__ = ["SNAPSHOT_TIMEOUT", "Snapshot", "snapshot_outcome", "take_snapshot"]
