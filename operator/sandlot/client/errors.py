"""What can go wrong for a program using sandboxes, one type per thing it can act on.

Every error is a ``SandlotError``; each says what happened and what to do, so a
program may print it as it is.
"""

from __future__ import annotations


class SandlotError(Exception):
    """Anything the SDK refuses or could not do."""


class SandboxNotFound(SandlotError):
    def __init__(self, namespace: str, name: str, what: str = "sandbox") -> None:
        super().__init__(f'{what} "{name}" not found in namespace {namespace}')
        self.namespace = namespace
        self.name = name


class Forbidden(SandlotError):
    """The API server or sandlot's gateway refused the caller (RBAC): the message names
    the verb and resource; ask for the role that grants it (``docs/streams.md``)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


class TimedOut(SandlotError):
    """A wait or a command passed its deadline. A command that timed out was ended
    (its stream closed, so the agent killed it); ``stdout``/``stderr`` hold what came."""

    def __init__(self, message: str, stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


class SandboxGone(SandlotError):
    """The sandbox ended (or was deleted) while it was being used or waited for.
    ``phase`` is its terminal phase (Dead, Stopped, Failed) or None when the object
    is gone; ``reason`` and ``detail`` come from its status. Start another sandbox."""

    def __init__(
        self, name: str, phase: str | None, reason: str | None = None, detail: str | None = None
    ) -> None:
        if phase is None:
            said = f'sandbox "{name}" was deleted'
        else:
            said = f'sandbox "{name}" is {phase}' + (f" ({reason})" if reason else "")
        super().__init__(said + (f": {detail}" if detail else "") + "; start or claim another")
        self.name = name
        self.phase = phase
        self.reason = reason
        self.detail = detail


class FileError(SandlotError):
    """The agent refused a file operation; ``status`` is the HTTP code its answer
    carries: 404 no such file, 403 outside the sandbox's root or not permitted,
    413 over the transfer cap, 400 a directory where a file was meant (and so on)."""

    def __init__(self, path: str, status: int, message: str) -> None:
        super().__init__(message if path in message else f"{path}: {message}")
        self.path = path
        self.status = status


class CommandError(SandlotError):
    """The command could not be started (no such program in the image, or ``env``/
    ``cwd`` asked of an image without ``/bin/sh``), or the stream broke before its
    exit status came while the sandbox still runs."""


__all__ = [
    "CommandError",
    "FileError",
    "Forbidden",
    "SandboxGone",
    "SandboxNotFound",
    "SandlotError",
    "TimedOut",
]
