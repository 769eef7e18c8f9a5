"""``Client``: sandboxes for a program, with the kubeconfig's (or the pod's) identity.

``create`` and ``claim`` return only once the sandbox runs, waiting by a watch
with a deadline; a wait that fails releases what it made (the Sandbox or the
SandboxClaim), so a timed-out call leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sandlot.adapters.sandboxapi import ApiRefused, SandboxApi
from sandlot.api.claim import ClaimPhase
from sandlot.api.common import CLAIMS, GROUP, SANDBOXES, SNAPSHOTS, VERSION
from sandlot.api.errors import UsageError
from sandlot.api.keys import CLAIM_LABEL
from sandlot.api.sandbox import SandboxPhase
from sandlot.api.timestamps import rfc3339
from sandlot.client.commands import ClosedOnExit
from sandlot.client.errors import SandboxGone, SandlotError, TimedOut
from sandlot.client.sandbox import Sandbox, gone_from, refusal
from sandlot.client.snapshots import Snapshot

CREATE_TIMEOUT = 120.0  # seconds: an image pull may come first
CLAIM_TIMEOUT = 60.0


def _running(body: Mapping[str, Any] | None) -> bool:
    return ((body or {}).get("status") or {}).get("phase") == SandboxPhase.RUNNING


def _last_seen(body: Mapping[str, Any] | None) -> str:
    status = (body or {}).get("status") or {}
    said = ", ".join(f"{k} {status[k]}" for k in ("phase", "reason", "message") if status.get(k))
    return f"last seen: {said}" if said else "it has no status yet"


class Client(ClosedOnExit):
    """Sandboxes in ``namespace`` (each call may name another).

    ``kubeconfig``: a kubeconfig file; None uses the in-cluster configuration in a
    pod, else ``$KUBECONFIG`` or ``~/.kube/config``."""

    def __init__(
        self, kubeconfig: str | os.PathLike[str] | None = None, namespace: str = "default"
    ) -> None:
        try:
            self._api = SandboxApi(os.fspath(kubeconfig) if kubeconfig is not None else None)
        except UsageError as e:  # the configuration cannot be loaded: the message says why
            raise SandlotError(str(e)) from None
        self.namespace = namespace

    def close(self) -> None:
        self._api.close()

    def get(self, name: str, *, namespace: str | None = None) -> Sandbox:
        """An existing Sandbox; a claimed one knows its claim (``terminate`` then
        deletes the claim, as for one this client claimed)."""
        ns = namespace or self.namespace
        try:
            body = self._api.get(SANDBOXES, ns, name)
        except ApiRefused as e:
            raise refusal(e, ns, name) from None
        claim = ((body.get("metadata") or {}).get("labels") or {}).get(CLAIM_LABEL)
        return Sandbox(self._api, body, claim=claim)

    def create(
        self,
        image: str,
        command: Sequence[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        node_name: str | None = None,
        spec: Mapping[str, Any] | None = None,
        timeout: float = CREATE_TIMEOUT,
        shutdown_time: datetime | None = None,
        shutdown_policy: str | None = None,
        ttl_seconds_after_finished: int | None = None,
        snapshot: str | Snapshot | None = None,
    ) -> Sandbox:
        """A new Sandbox of ``image`` (running ``command``, else the image's own),
        returned once Running. ``spec`` adds any other Sandbox spec field (camelCase,
        as in YAML); ``name`` defaults to a generated ``sandbox-xxxxx``. At
        ``shutdown_time`` (an aware datetime) it is stopped (``shutdown_policy``
        ``"Retain"``, the default) or deleted (``"Delete"``); once finished it is
        deleted after ``ttl_seconds_after_finished``. With ``snapshot`` (a ``Snapshot``
        or its name) it starts from that snapshot's filesystem, on the node that
        keeps it ("fork")."""
        ns = namespace or self.namespace
        ending = lifecycle_fields(shutdown_time, shutdown_policy, ttl_seconds_after_finished)
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name} if name else {"generateName": "sandbox-"},
            "spec": {
                **(spec or {}),
                **ending,
                "image": image,
                **({"command": list(command)} if command else {}),
                **({"env": [{"name": k, "value": v} for k, v in env.items()]} if env else {}),
                **({"nodeName": node_name} if node_name else {}),
                **({"snapshotRef": {"name": _name_of(snapshot)}} if snapshot else {}),
            },
        }
        try:
            made = self._api.create(SANDBOXES, ns, body)
        except ApiRefused as e:
            raise refusal(e, ns, name or "(new)") from None
        made_name = made["metadata"]["name"]
        try:
            running = self._until(SANDBOXES, ns, made_name, _running_or_gone(made_name), timeout)
        except BaseException:
            self._release(SANDBOXES, ns, made_name)
            raise
        return Sandbox(self._api, running)

    def snapshot(self, name: str, *, namespace: str | None = None) -> Snapshot:
        """An existing SandboxSnapshot."""
        ns = namespace or self.namespace
        try:
            return Snapshot(self._api, self._api.get(SNAPSHOTS, ns, name))
        except ApiRefused as e:
            raise refusal(e, ns, name, "snapshot") from None

    def claim(
        self,
        pool: str,
        *,
        namespace: str | None = None,
        name: str | None = None,
        timeout: float = CLAIM_TIMEOUT,
        shutdown_time: datetime | None = None,
        shutdown_policy: str | None = None,
        ttl_seconds_after_finished: int | None = None,
    ) -> Sandbox:
        """A sandbox of ``pool`` through a new SandboxClaim, returned once the claim is
        Bound and its sandbox Running; ``terminate`` deletes the claim. The claim's
        ``spec.lifecycle``: at ``shutdown_time`` its sandbox is stopped and the claim
        Expired (``"Retain"``, the default) or both deleted (``"Delete"``); a Lost or
        Expired claim is deleted after ``ttl_seconds_after_finished``."""
        ns = namespace or self.namespace
        deadline = time.monotonic() + timeout
        lifecycle = lifecycle_fields(shutdown_time, shutdown_policy, ttl_seconds_after_finished)
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name} if name else {"generateName": f"{pool}-"},
            "spec": {"poolName": pool, **({"lifecycle": lifecycle} if lifecycle else {})},
        }
        try:
            claim = self._api.create(CLAIMS, ns, body)
        except ApiRefused as e:
            raise refusal(e, ns, name or "(new)", "sandboxclaim") from None
        claim_name = claim["metadata"]["name"]
        try:
            bound = self._until(CLAIMS, ns, claim_name, _settled_claim, deadline - time.monotonic())
            status = (bound or {}).get("status") or {}
            if status.get("phase") != ClaimPhase.BOUND:
                raise SandboxGone(
                    status.get("sandboxName") or claim_name,
                    None,
                    "ClaimLost",
                    f"claim {claim_name} is {status.get('phase')}: {status.get('message')}",
                )
            sandbox_name = str(status["sandboxName"])
            running = self._until(
                SANDBOXES,
                ns,
                sandbox_name,
                _running_or_gone(sandbox_name),
                deadline - time.monotonic(),
            )
        except BaseException:
            self._release(CLAIMS, ns, claim_name)
            raise
        return Sandbox(self._api, running, claim=claim_name)

    def _until(
        self,
        plural: str,
        namespace: str,
        name: str,
        done: Callable[[dict[str, Any] | None], bool],
        timeout: float,
    ) -> dict[str, Any]:
        """The object once ``done`` holds; ``SandboxGone`` when it ended or went away,
        ``TimedOut`` (with what was last seen) past ``timeout`` seconds."""
        seen: list[dict[str, Any] | None] = [None]

        def watching(body: dict[str, Any] | None) -> bool:
            seen[0] = body
            return done(body)

        what = plural[:-1]
        try:
            body = self._api.wait(plural, namespace, name, watching, time.monotonic() + timeout)
        except TimeoutError:
            raise TimedOut(
                f"{what} {namespace}/{name} was not ready within {timeout:.0f}s; "
                f"{_last_seen(seen[0])}"
            ) from None
        except ApiRefused as e:
            raise refusal(e, namespace, name, what) from None
        if body is None:
            raise SandboxGone(name, None, detail=f"the {what} was deleted while waiting for it")
        if plural == SANDBOXES and not _running(body):
            gone = gone_from(name, body)
            raise gone if gone else SandlotError(f"{what} {name}: {_last_seen(body)}")
        return body

    def _release(self, plural: str, namespace: str, name: str) -> None:
        # The error that made us release it is the one to raise, not this one.
        with contextlib.suppress(ApiRefused):
            self._api.delete(plural, namespace, name)


SHUTDOWN_POLICIES = ("Retain", "Delete")


def _name_of(snapshot: str | Snapshot) -> str:
    return snapshot if isinstance(snapshot, str) else snapshot.name


def lifecycle_fields(
    shutdown_time: datetime | None, shutdown_policy: str | None, ttl_seconds: int | None
) -> dict[str, Any]:
    """The lifecycle arguments as spec fields (camelCase); ValueError naming a bad one."""
    out: dict[str, Any] = {}
    if shutdown_time is not None:
        if shutdown_time.tzinfo is None:
            raise ValueError(
                f"shutdown_time {shutdown_time.isoformat()} has no time zone "
                "(give an aware datetime, for example datetime.now(UTC) + timedelta(...))"
            )
        out["shutdownTime"] = rfc3339(shutdown_time, "auto")
    if shutdown_policy is not None:
        if shutdown_policy not in SHUTDOWN_POLICIES:
            raise ValueError(f"shutdown_policy {shutdown_policy!r}: Retain or Delete")
        out["shutdownPolicy"] = shutdown_policy
    if ttl_seconds is not None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 0:
            raise ValueError(f"ttl_seconds_after_finished {ttl_seconds!r}: a whole number >= 0")
        out["ttlSecondsAfterFinished"] = ttl_seconds
    return out


def _running_or_gone(name: str) -> Callable[[dict[str, Any] | None], bool]:
    return lambda body: _running(body) or gone_from(name, body) is not None


def _settled_claim(body: dict[str, Any] | None) -> bool:
    return body is None or (
        (body.get("status") or {}).get("phase")
        in (ClaimPhase.BOUND, ClaimPhase.LOST, ClaimPhase.EXPIRED)
    )


__all__ = ["CLAIM_TIMEOUT", "CREATE_TIMEOUT", "Client"]
