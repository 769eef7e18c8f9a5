"""One guarded way to write a Sandbox's status, for the agent and the operator alike.

Every phase change is a merge-patch of the status subresource carrying the
resourceVersion it was decided on, so a concurrent write is never clobbered. A 409
re-reads the Sandbox and decides again on what is there now:

- **gone**: it was deleted (404), or the name now holds another object: a new
  ``metadata.uid`` (deleted and created again) or a ``spec.nodeName`` other than
  the node the write was meant for. Writing to that object would end a sandbox
  nobody asked about.
- **skipped**: it is terminal already (the API server would refuse to leave that
  phase anyway), or in a phase the write must not overwrite (``allowed_from``).
- otherwise the write is retried with the new resourceVersion, up to
  ``max_attempts``; **conflicted** when they run out; **refused** when the API
  server answered with a 4xx other than 404/409 (invalid, forbidden, too large:
  the same write cannot succeed, so it must not be retried at once); **failed** on
  anything else (429, 5xx, no answer at all). Reported, never raised, so a caller
  ending many sandboxes learns which ones are left.

A caller that watches the object may hand over its ``latest`` view: when that is the
same object (uid, node) at a later resourceVersion than the one decided on (ordered
as ``api.resourceversion`` allows), the write starts from it, as it would after a 409
and a re-read that found it, without the doomed first attempt and the read (the
object changed since the decision, so the server holds a later version too). The
same checks apply to it first. Otherwise a resourceVersion is opaque: it is sent
back as read and never compared as a number.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from sandlot.api.resourceversion import newer
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


class SandboxStatusApi(Protocol):
    """What a status write needs of ``adapters.objects.Objects``."""

    def get_sandbox(self, namespace: str, name: str) -> dict[str, Any]: ...

    def patch_sandbox_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]: ...


class WriteOutcome(StrEnum):
    WRITTEN = "written"
    GONE = "gone"
    """Deleted, or the name now holds another Sandbox (new uid, other node)."""
    SKIPPED = "skipped"
    """Terminal already, or in a phase this write must not overwrite."""
    CONFLICTED = "conflicted"
    """Still 409 after every attempt."""
    REFUSED = "refused"
    """The API server refused this write for good (a 4xx other than 404, 409, 429)."""
    FAILED = "failed"
    """A transient failure: 429, 5xx or no answer (``detail`` says which)."""


@dataclass(frozen=True)
class WriteResult:
    outcome: WriteOutcome
    detail: str = ""
    written: Mapping[str, Any] | None = None
    """The Sandbox as the API server returned it from the write (WRITTEN only)."""


def phase_of(obj: Mapping[str, Any]) -> SandboxPhase:
    """The Sandbox's ``status.phase``; Pending before anything wrote one."""
    return SandboxPhase((obj.get("status") or {}).get("phase") or SandboxPhase.PENDING)


def _node_of(obj: Mapping[str, Any]) -> str | None:
    return (obj.get("spec") or {}).get("nodeName")


def _refusal(obj: Mapping[str, Any], allowed_from: Collection[SandboxPhase] | None) -> bool:
    phase = phase_of(obj)
    return phase in TERMINAL_PHASES or (allowed_from is not None and phase not in allowed_from)


def _another_object(current: Mapping[str, Any], uid: str | None, node: str | None) -> bool:
    if uid is not None and current["metadata"].get("uid") != uid:
        return True
    return node is not None and _node_of(current) != node


def _status(exc: Exception) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


def _refused(exc: Exception) -> bool:
    code = _status(exc)
    return code is not None and 400 <= code < 500 and code not in (404, 409, 429)


def _describe(exc: Exception) -> str:
    # An API error by its code and reason; a transport error (no answer) by its text.
    return f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)


def later_view(
    latest: Mapping[str, Any], decided: Mapping[str, Any], uid: str | None, node: str | None
) -> bool:
    """Whether ``latest`` is the very object ``decided`` was read as (same uid, still
    bound to ``node``) at a later resourceVersion: what a re-read after the 409 that
    a write at ``decided``'s version must get would find, or an older view of it."""
    if _another_object(latest, uid, node):
        return False
    version = (latest.get("metadata") or {}).get("resourceVersion")
    return newer(version, decided["metadata"].get("resourceVersion")) is True


StatusFor = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""The status to write, computed from the Sandbox as last read (to merge into it)."""


def write_status(
    objects: SandboxStatusApi,
    obj: Mapping[str, Any],
    status: Mapping[str, Any] | StatusFor,
    *,
    node: str | None = None,
    allowed_from: Collection[SandboxPhase] | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    latest: Mapping[str, Any] | None = None,
) -> WriteResult:
    """Write ``status`` onto the Sandbox ``obj`` was read as, guarded by its
    resourceVersion (see the module's docstring for the outcomes).

    ``node`` is the node the Sandbox must still be bound to (default: the one ``obj``
    names). ``allowed_from`` limits the phases the write may replace. ``status`` may
    be a function of the Sandbox as last read, for fields merged into what is there
    (a merge patch replaces a list such as ``conditions`` whole): it is computed
    again after every re-read, and the resourceVersion guards the result.
    ``latest``: the caller's freshest view of the object without a request (its
    watch), used in place of ``obj`` when it is that object at a later version.
    """
    meta = obj["metadata"]
    ns, name = meta["namespace"], meta["name"]
    uid: str | None = meta.get("uid")
    node = node if node is not None else _node_of(obj)
    current: Mapping[str, Any] = obj
    if latest is not None and later_view(latest, obj, uid, node):
        current = latest
    for _ in range(max_attempts):
        if _refusal(current, allowed_from):
            return WriteResult(WriteOutcome.SKIPPED, f"phase {phase_of(current)}")
        try:
            body = status(current) if callable(status) else status
            written = objects.patch_sandbox_status(
                ns, name, body, resource_version=current["metadata"].get("resourceVersion")
            )
            return WriteResult(WriteOutcome.WRITTEN, written=written)
        except Exception as exc:
            if _status(exc) == 404:
                return WriteResult(WriteOutcome.GONE, "deleted")
            if _refused(exc):
                return WriteResult(WriteOutcome.REFUSED, _describe(exc))
            if _status(exc) != 409:
                return WriteResult(WriteOutcome.FAILED, _describe(exc))
        try:
            current = objects.get_sandbox(ns, name)
        except Exception as exc:
            if _status(exc) == 404:
                return WriteResult(WriteOutcome.GONE, "deleted")
            return WriteResult(WriteOutcome.FAILED, f"re-read after conflict: {_describe(exc)}")
        if _another_object(current, uid, node):
            return WriteResult(WriteOutcome.GONE, "replaced by another Sandbox of that name")
    return WriteResult(WriteOutcome.CONFLICTED, f"still conflicting after {max_attempts} attempts")


__all__ = [
    "MAX_ATTEMPTS",
    "SandboxStatusApi",
    "WriteOutcome",
    "WriteResult",
    "later_view",
    "phase_of",
    "write_status",
]
