"""A command in a sandbox: its output as it comes (``Execution``) and all of it at the
end (``Result``).

Exec runs the argv it is given with the container's own process spec (user,
environment, working directory); the stream protocol carries no environment or
directory of its own. ``env`` and ``cwd`` are therefore carried by ``/bin/sh``:
the command becomes ``sh -c 'cd DIR && export K=V && exec ARGV'`` with every
value quoted, so they need a shell in the image; without one the agent cannot
start ``/bin/sh`` and ``CommandError`` says so. A string command always goes
through ``/bin/sh -c``; a list is run as it is.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from types import TracebackType
from typing import Self

from sandlot.adapters.streamclient import Stream
from sandlot.api.reasons import ExecReason
from sandlot.client.errors import CommandError, SandboxGone, TimedOut
from sandlot.policy.streams import (
    STATUS,
    STDERR,
    STDIN,
    STDOUT,
    close_stdin_frame,
    decode_frame,
    encode_frame,
)

SHELL = "/bin/sh"
CHUNK = 64 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Exit codes above this mean a signal ended the command: perhaps the sandbox's end.
SIGNALLED = 128


class ClosedOnExit:
    """Closed (``close()``) when a ``with`` block around it ends, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Channel(IntEnum):
    STDOUT = STDOUT
    STDERR = STDERR


@dataclass(frozen=True)
class Result:
    stdout: bytes
    stderr: bytes
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout as text (UTF-8, undecodable bytes replaced)."""
        return self.stdout.decode(errors="replace")


@dataclass(frozen=True)
class Outcome:
    """What a stream's status message said: an exit code, or a failure with the HTTP
    code it stands for; ``status is None`` means the stream ended without one."""

    exit_code: int | None
    code: int = 0
    message: str = ""
    status: bytes | None = b""


def read_status(status: bytes | None) -> Outcome:
    if status is None:
        return Outcome(None, 0, "the stream ended before its status came", None)
    try:
        body = json.loads(status)
    except ValueError:
        return Outcome(None, 500, f"unreadable status: {status[:200]!r}", status)
    if body.get("status") == "Success":
        return Outcome(0, status=status)
    if body.get("reason") == ExecReason.NON_ZERO_EXIT_CODE:
        for cause in (body.get("details") or {}).get("causes") or []:
            if (
                cause.get("reason") == ExecReason.EXIT_CODE
                and str(cause.get("message", "")).isdigit()
            ):
                return Outcome(int(cause["message"]), status=status)
    message = str(body.get("message") or "the stream failed")
    return Outcome(None, int(body.get("code") or 500), message, status)


def stdout_until_status(
    stream: Stream, timeout: Callable[[], float | None], stdout: Callable[[bytes], object]
) -> bytes | None:
    """Hand each stdout frame to ``stdout`` until the status frame, and return it (None:
    the stream ended first); each wait at most ``timeout()`` seconds (None: no bound),
    else TimeoutError."""
    while (message := stream.recv(timeout=timeout())) is not None:
        channel, data = decode_frame(message)
        if channel == STDOUT:
            stdout(data)
        elif channel == STATUS:
            return data
    return None


def command_argv(
    command: str | Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[tuple[str, ...], bool]:
    """(the argv to exec, whether it goes through ``/bin/sh``)."""
    if isinstance(command, str):
        script = command
    else:
        argv = tuple(command)
        if not argv:
            raise ValueError("a command needs at least one word")
        if not env and cwd is None:
            return argv, False
        script = "exec " + shlex.join(argv)
    lines = []
    if cwd is not None:
        if not cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path (got {cwd!r})")
        lines.append(f"cd {shlex.quote(cwd)} || exit 1")
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise ValueError(f"environment variable name {key!r}: letters, digits and _ only")
        lines.append(f"export {key}={shlex.quote(value)}")
    return (SHELL, "-c", "\n".join([*lines, script])), True


class Execution(ClosedOnExit):
    """One running command: iterate for ``(Channel, bytes)`` as output comes; after
    the last, ``exit_code`` is set. Closing it early (or leaving its ``with``) ends
    the command: the agent kills it when its stream closes."""

    def __init__(
        self,
        stream: Stream,
        *,
        describe: str,
        through_shell: bool,
        deadline: float | None,
        timeout: float | None,
        gone: Callable[[], SandboxGone | None],
        stdin: bytes | None = None,
    ) -> None:
        self._stream = stream
        self._describe = describe
        self._through_shell = through_shell
        self._deadline = deadline
        self._timeout = timeout
        self._gone = gone
        self.exit_code: int | None = None
        if stdin is not None:
            threading.Thread(target=self._send_stdin, args=(stdin,), daemon=True).start()

    def _send_stdin(self, data: bytes) -> None:
        try:
            for start in range(0, len(data), CHUNK):
                self._stream.send(encode_frame(STDIN, data[start : start + CHUNK]))
            self._stream.send(close_stdin_frame())
        except Exception:  # the stream ended first: the outcome says why
            return

    def __iter__(self) -> Iterator[tuple[Channel, bytes]]:
        status: bytes | None = None
        try:
            while True:
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                message = self._stream.recv(timeout=left)
                if message is None:
                    break
                channel, data = decode_frame(message)
                if channel in (STDOUT, STDERR):
                    yield Channel(channel), data
                elif channel == STATUS:
                    status = data
                    break
        except TimeoutError:
            self.close()
            raise TimedOut(
                f"{self._describe} ran past its {self._timeout}s timeout and was ended"
            ) from None
        finally:
            self.close()
        self.exit_code = self._conclude(read_status(status))

    def _conclude(self, outcome: Outcome) -> int:
        if outcome.exit_code is not None:
            if outcome.exit_code > SIGNALLED and (gone := self._gone()) is not None:
                raise gone
            return outcome.exit_code
        if (gone := self._gone()) is not None:
            raise gone
        if self._through_shell and f"cannot run {SHELL!r}" in outcome.message:
            raise CommandError(
                f"{self._describe}: env= and cwd= (and string commands) run through {SHELL}, "
                f"which this image cannot start ({outcome.message}); pass a list and no "
                "env/cwd, or use an image with a shell"
            )
        raise CommandError(f"{self._describe}: {outcome.message}")

    def close(self) -> None:
        self._stream.close()


def collect(execution: Execution) -> Result:
    """All of ``execution``'s output; a ``TimedOut`` carries what came before it."""
    out: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
    try:
        for channel, data in execution:
            out[channel].append(data)
    except TimedOut as e:
        e.stdout, e.stderr = b"".join(out[STDOUT]), b"".join(out[STDERR])
        raise
    assert execution.exit_code is not None
    return Result(b"".join(out[STDOUT]), b"".join(out[STDERR]), execution.exit_code)


__all__ = ["Channel", "Execution", "Outcome", "Result", "collect", "command_argv", "read_status"]
