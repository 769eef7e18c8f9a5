"""``Sandbox``: one running sandbox as a program uses it (commands, files, the end).

Every stream goes through the API server to sandlot's gateway with the client's
own identity, as ``sandlot exec`` and ``sandlot cp`` do. When a stream ends
without its answer (cut, or the command killed by a signal), the sandbox's own
status is read once to tell a command that died from a sandbox that ended:
``SandboxGone`` names its phase and reason.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from sandlot.adapters.sandboxapi import ApiRefused, SandboxApi
from sandlot.adapters.streamclient import Stream, StreamRefused
from sandlot.api.common import CLAIMS, SANDBOXES
from sandlot.api.reasons import ConditionType
from sandlot.api.sandbox import TERMINAL_PHASES, OperatingMode
from sandlot.client.commands import Execution, Result, collect, command_argv
from sandlot.client.errors import CommandError, Forbidden, SandboxGone, SandlotError, TimedOut
from sandlot.client.files import Files
from sandlot.client.refusals import refusal
from sandlot.client.snapshots import SNAPSHOT_TIMEOUT, Snapshot, take_snapshot
from sandlot.client.tunnel import Tunnel
from sandlot.policy.operatingmode import mode_outcome
from sandlot.policy.streams import EXEC, FILES, PORTFORWARD, StreamRequest, api_path

MODE_TIMEOUT = 30.0  # seconds for the agent to freeze or thaw the processes


def gone_from(name: str, body: Mapping[str, Any] | None) -> SandboxGone | None:
    """``SandboxGone`` when ``body`` (None: deleted) is an ended sandbox, else None."""
    if body is None:
        return SandboxGone(name, None)
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase in TERMINAL_PHASES:
        return SandboxGone(name, str(phase), status.get("reason"), status.get("message"))
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return SandboxGone(name, None, detail="its deletion has begun")
    return None


class Sandbox:
    """A sandbox in ``namespace``; from ``Client.create``, ``claim`` or ``get``.

    ``with`` it to make sure it is released: leaving the block calls ``terminate``."""

    def __init__(
        self, api: SandboxApi, body: Mapping[str, Any], *, claim: str | None = None
    ) -> None:
        self._api = api
        self.body = dict(body)
        self.name: str = body["metadata"]["name"]
        self.namespace: str = body["metadata"]["namespace"]
        self.claim = claim  # the SandboxClaim that holds it, when claimed
        self.files = Files(self._open_files, self._gone)

    def __repr__(self) -> str:
        return f"Sandbox({self.namespace}/{self.name}, {self.phase})"

    @property
    def phase(self) -> str:
        return str((self.body.get("status") or {}).get("phase") or "Pending")

    @property
    def ip(self) -> str | None:
        return (self.body.get("status") or {}).get("ip")

    def refresh(self) -> Sandbox:
        """Read the sandbox again (``phase``, ``ip`` and ``body`` follow)."""
        try:
            self.body = self._api.get(SANDBOXES, self.namespace, self.name)
        except ApiRefused as e:
            raise refusal(e, self.namespace, self.name) from None
        return self

    # -- commands ------------------------------------------------------------------

    def stream(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> Execution:
        """Start ``command``; iterate the answer for ``(Channel, bytes)`` as output
        comes, then read its ``exit_code``. A string runs through ``/bin/sh -c``;
        ``env`` and ``cwd`` need ``/bin/sh`` in the image (``sandlot.client.commands``)."""
        argv, through_shell = command_argv(command, env, cwd)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        request = StreamRequest(
            EXEC, self.namespace, self.name, command=argv, stdin=data is not None
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        first = command if isinstance(command, str) else command[0]
        describe = f"{first!r} in sandbox {self.namespace}/{self.name}"
        return Execution(
            self._open(request),
            describe=describe,
            through_shell=through_shell,
            deadline=deadline,
            timeout=timeout,
            gone=self._gone,
            stdin=data,
        )

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> Result:
        """Run ``command`` to its end: its stdout, stderr and exit code. A non-zero
        exit is a ``Result``, not an error; past ``timeout`` seconds the command is
        ended and ``TimedOut`` raised."""
        return collect(self.stream(command, timeout=timeout, env=env, cwd=cwd, stdin=stdin))

    def port(self, remote: int, *, local: int = 0, host: str = "127.0.0.1") -> Tunnel:
        """A local address (``tunnel.address``, ``tunnel.url``) whose connections
        reach ``remote`` on the sandbox's loopback, through the API server; ``local``
        0 picks a free port. Close it (or ``with`` it) to stop listening."""
        if not 0 < remote <= 65535:
            raise ValueError(f"port {remote}: from 1 to 65535")
        self.refresh()  # not found or forbidden now, not at the first connection
        request = StreamRequest(PORTFORWARD, self.namespace, self.name, port=remote)
        return Tunnel(lambda: self._open(request), host, local)

    # -- operating mode -------------------------------------------------------------

    def pause(self, *, timeout: float = MODE_TIMEOUT) -> Sandbox:
        """Freeze the sandbox's processes (``spec.operatingMode: Paused``), memory
        kept, and return once its agent reports them frozen (the ``Paused``
        condition). Commands and files are refused until ``resume``."""
        return self._set_mode(OperatingMode.PAUSED, timeout)

    def suspend(self, *, timeout: float = MODE_TIMEOUT) -> Sandbox:
        """Commit the sandbox's filesystem on its node and remove its container
        (``spec.operatingMode: Suspended``): no memory or CPU held. Returns once its
        agent reports it (the ``Suspended`` condition). Its processes end; its files
        are there again after ``resume``."""
        return self._set_mode(OperatingMode.SUSPENDED, timeout)

    def resume(self, *, timeout: float = MODE_TIMEOUT) -> Sandbox:
        """Thaw a paused sandbox, or start a suspended one again from its committed
        filesystem (``spec.operatingMode: Running``), and return once its agent
        reports it running. One its agent paused for being idle returns at once:
        its next exec, file call or port-forward resumes it."""
        return self._set_mode(OperatingMode.RUNNING, timeout)

    def _set_mode(self, mode: OperatingMode, timeout: float) -> Sandbox:
        deadline = time.monotonic() + timeout
        try:
            self.body = self._api.patch(
                SANDBOXES, self.namespace, self.name, {"spec": {"operatingMode": str(mode)}}
            )
        except ApiRefused as e:
            raise refusal(e, self.namespace, self.name) from None
        seen: list[dict[str, Any] | None] = [self.body]

        def settled(body: dict[str, Any] | None) -> bool:
            seen[0] = body
            return (
                gone_from(self.name, body) is not None or mode_outcome(body or {}, mode) is not None
            )

        try:
            body = self._api.wait(SANDBOXES, self.namespace, self.name, settled, deadline)
        except TimeoutError:
            conditions = ((seen[0] or {}).get("status") or {}).get("conditions") or []
            said = [
                c
                for c in conditions
                if c.get("type") in (ConditionType.PAUSED, ConditionType.SUSPENDED)
            ]
            raise TimedOut(
                f"sandbox {self.namespace}/{self.name}: its agent did not report it "
                f"{mode} within {timeout:.0f}s (Paused/Suspended conditions: "
                f"{said or 'none'}); "
                f"is it Running, and its node Ready?"
            ) from None
        except ApiRefused as e:
            raise refusal(e, self.namespace, self.name) from None
        if (gone := gone_from(self.name, body)) is not None:
            raise gone
        assert body is not None  # not gone
        self.body = body
        if (outcome := mode_outcome(body, mode)) != "applied":
            raise CommandError(f"sandbox {self.namespace}/{self.name}: {outcome}")
        return self

    # -- snapshots -----------------------------------------------------------------

    def snapshot(self, name: str | None = None, *, timeout: float = SNAPSHOT_TIMEOUT) -> Snapshot:
        """Take its filesystem as it is now (a SandboxSnapshot, ``name`` or a generated
        ``<sandbox>-xxxxx``) and return once its node has it; the sandbox goes on
        running (frozen for the length of the commit). Start others from it with
        ``Client.create(..., snapshot=...)``. A snapshot that fails raises
        ``CommandError`` naming why, and is deleted."""
        return take_snapshot(self._api, self.namespace, self.name, name, timeout)

    # -- the end -------------------------------------------------------------------

    def terminate(self) -> None:
        """Release the sandbox: delete its claim (which deletes it) when it was
        claimed, else delete it. One already gone is no error."""
        plural, name = (CLAIMS, self.claim) if self.claim else (SANDBOXES, self.name)
        try:
            self._api.delete(plural, self.namespace, name)
        except ApiRefused as e:
            raise refusal(e, self.namespace, name, plural[:-1]) from None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.terminate()
            return
        # The block's own error is the one to see; the release is still tried.
        with contextlib.suppress(SandlotError):
            self.terminate()

    # -- streams -------------------------------------------------------------------

    def _open_files(self, op: str, path: str) -> Stream:
        return self._open(StreamRequest(FILES, self.namespace, self.name, op=op, path=path))

    def _open(self, request: StreamRequest) -> Stream:
        try:
            try:
                return self._api.open_stream(api_path(request))
            except StreamRefused as e:
                # 502: the gateway could not open the agent's side, so nothing ran.
                # Files and port-forward are tried once more; exec is not, since a
                # command may have started behind an answer that was lost.
                if e.status != 502 or request.kind == EXEC:
                    raise
                return self._api.open_stream(api_path(request))
        except StreamRefused as e:
            what = f"{request.kind} in sandbox {self.namespace}/{self.name}"
            if e.status in (401, 403):
                raise Forbidden(f"{what} refused: {e.message}", e.status) from None
            if (gone := self._gone()) is not None:
                raise gone from None
            raise CommandError(f"{what} refused ({e.status}): {e.message}") from None

    def _gone(self) -> SandboxGone | None:
        """Whether the sandbox has ended (one read of its status)."""
        try:
            body: dict[str, Any] | None = self._api.get(SANDBOXES, self.namespace, self.name)
        except ApiRefused as e:
            if e.status != 404:
                return None  # cannot tell: the caller's own error stands
            body = None
        if body is not None:
            self.body = body
        return gone_from(self.name, body)


__all__ = ["MODE_TIMEOUT", "Sandbox", "gone_from", "refusal"]
