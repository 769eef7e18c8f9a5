"""A sandbox's files through the files tool the agent mounts into it
(``policy.ocispec.FILES_TOOL``, built from ``operator/filetool``).

Each operation is one exec of the tool through containerd, as ``sandlot exec``
runs a command: in the sandbox's own namespaces, as its process user and groups,
with no capabilities and ``noNewPrivileges``. So the files reached are the task's
own whatever the agent's view of the node's pids (the chart's default runs it
without the node's ``/proc``), nothing of the node or of the agent can be named,
and what the sandbox's user may not read or change (``/proc/kmsg``, the kernel's
addresses in ``/proc/kallsyms``, a root-owned file) is refused as it is to the
sandbox. The tool still resolves every path beneath ``/`` with ``openat2``, so a
link out of the root is refused as it always was.

The tool is the agent's, never the image's: a distroless image works, and what a
tenant put in its image is never run for the files API. Containers made before the
node had the tool have no mount: ``agent.streams`` then uses the image's own tools
(``agent.containerfiles``), the same bounds.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator, Sequence
from typing import Any

from sandlot.adapters.containerd.execs import ExecProcess
from sandlot.adapters.sandboxfs import FileRefused
from sandlot.agent.containerfiles import STAT_LINE_MAX, ContainerRoot, MissingTool, stderr_of
from sandlot.policy.ocispec import FILES_TOOL


class ToolRoot(ContainerRoot):
    """The files of ``container`` through its mounted files tool, one exec per call."""

    def stat(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = json.loads(self._run(["stat", path], path, STAT_LINE_MAX))
        return entry

    def list(self, path: str, limit: int) -> list[dict[str, Any]]:
        out = self._run(["list", path, str(limit)], path, (limit + 1) * STAT_LINE_MAX)
        entries: list[dict[str, Any]] = json.loads(out)
        return entries

    def read(self, path: str, limit: int) -> Iterator[bytes]:
        """The file's bytes in chunks; refused past ``limit`` bytes or when not a file
        (the tool checks both before it sends anything, and counts as it reads)."""
        yield from self._capped(self._start(["read", path, str(limit)], stdin=False), path, limit)

    def write(self, path: str, chunks: Iterator[bytes], limit: int) -> int:
        """Replace ``path`` with the bytes of ``chunks`` at once (the tool writes a
        temporary file beside it and renames it once its stdin ends); the bytes
        written. Anything that stops the write early (over ``limit``, the client gone
        or silent) ends the tool with SIGTERM first, which removes its temporary file."""
        process = self._start(["write", path, str(limit)], stdin=True)
        finished = False
        try:
            written = self._feed(process, chunks, path, limit)
            finished = True
            self._finish(process, path)
            return written
        finally:
            if not finished:
                self._abandon(process)
            self._end(process)

    def mkdir(self, path: str) -> bool:
        """Make the directory ``path`` (its parent must exist), ``0755``; True when
        made, False when a directory was already there. Anything else is refused."""
        return self._run(["mkdir", path], path, STAT_LINE_MAX).strip() == b"1"

    def remove(self, path: str) -> None:
        self._run(["remove", path], path, STAT_LINE_MAX)

    # -- one exec of the tool ----------------------------------------------------------

    def _start(self, argv: Sequence[str], *, stdin: bool) -> ExecProcess:
        try:
            return self._exec([FILES_TOOL, *argv], stdin=stdin)
        except MissingTool:
            raise FileRefused(
                503, f"the sandbox has no files tool at {FILES_TOOL} (made before its node had it)"
            ) from None

    def _finish(self, process: ExecProcess, path: str) -> None:
        code = self.execs.wait(process, timeout=self.call_timeout)
        if code == 0:
            return
        raise tool_refusal(stderr_of(process), path, code)

    def _abandon(self, process: ExecProcess) -> None:
        """End a write that will not complete; wait (bounded) until the tool is gone,
        so its temporary file is too before the caller answers."""
        with contextlib.suppress(Exception):
            self.execs.kill(process, timeout=self.call_timeout, sig=signal.SIGTERM)
        with contextlib.suppress(Exception):
            self.execs.wait(process, timeout=self.call_timeout)


def tool_refusal(said: str, path: str, code: int) -> FileRefused:
    """The tool's refusal, ``STATUS why`` on its stderr, as a ``FileRefused``."""
    status, _, why = said.partition(" ")
    if status.isdigit() and why:
        return FileRefused(int(status), why)
    return FileRefused(500, f"{path}: the files tool ended with {code}: {said or 'no reason'}")


__all__ = ["ToolRoot", "tool_refusal"]
