"""A sandbox's files through the container itself, with the image's own tools: for
a container without the agent's files tool (``agent.toolfiles``): one of a handler
whose task gives the node no view of them (``policy.runtimeclass.host_view``:
gVisor's sentry serves the container's files), or one made before its node had it.

Each operation is one short exec of a tool the image has (busybox's ``stat``,
``cat``, ``sh``, ``mv``, ``mkdir``, ``rm``, ``rmdir``; a tool the image does
not link is run as ``busybox <tool>``), run as the sandbox's own process user
with no capabilities, so it sees and can change at most what the sandbox's user
can. An image without the tool is refused by name. Every start and wait is
bounded by ``call_timeout``, every silence on a stream by ``idle``.

Its methods are the files API's: ``stat``, ``list``, ``read``, ``write``,
``mkdir``, ``remove``, ``close``. ``ContainerPort`` does the same for
port-forward: a program in the container (the image's ``nc``, or the files
tool's ``connect``) connects to its own loopback, where a server bound to
127.0.0.1 is reached under every handler (the sandbox's address on its network
would miss it, and a sandbox without a network has none).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sandlot.adapters.containerd.execs import ExecProcess, Execs
from sandlot.adapters.sandboxfs import FileRefused

CHUNK = 64 * 1024
STAT_FORMAT = "%f %s %Y %n"  # raw mode (hex), size, mtime, name: lstat, links unfollowed
STDERR_MAX = 4096
# The most a stat line may take (mode, size, mtime and a name of up to 255 bytes,
# escaped): the image's own tools print these, so what the agent reads of them is
# capped, never taken whole.
STAT_LINE_MAX = 2048
TOOLS = "sh, stat, cat, mv, mkdir, rm, rmdir and nc"
# In the scripts, ``b tool ...`` runs the image's tool, else busybox's applet.
EITHER = 'b() { if command -v "$1" >/dev/null 2>&1; then "$@"; else busybox "$@"; fi; }; '
LIST_SCRIPT = (
    EITHER + 'cd -- "$1" || exit 1; set --; for f in .* *; do case "$f" in .|..) continue;; '
    'esac; [ -e "$f" ] || [ -L "$f" ] || continue; set -- "$@" "$f"; done; '
    f'[ $# -eq 0 ] || b stat -c "{STAT_FORMAT}" -- "$@"'
)
WRITE_SCRIPT = EITHER + 'b cat > "$1" && b mv -f -- "$1" "$2" || { b rm -f -- "$1"; exit 1; }'


class ContainerRoot:
    """The files of ``container`` as its processes see them, one exec per call."""

    def __init__(self, execs: Execs, container: str, *, call_timeout: float, idle: float) -> None:
        self.execs = execs
        self.container = container
        self.call_timeout = call_timeout
        self.idle = idle

    def close(self) -> None:
        pass

    def stat(self, path: str) -> dict[str, Any]:
        out = self._run(["stat", "-c", STAT_FORMAT, "--", _inside(path)], path, STAT_LINE_MAX)
        entry = _parse_stat(out.decode(errors="replace").rstrip("\n"))
        entry["name"] = os.path.basename(path.rstrip("/")) or "/"
        return entry

    def list(self, path: str, limit: int) -> list[dict[str, Any]]:
        if self.stat(path)["type"] != "dir":
            raise FileRefused(400, f"{path}: not a directory")
        most = (limit + 1) * STAT_LINE_MAX
        out = self._run(["sh", "-c", LIST_SCRIPT, "sh", _inside(path)], path, most)
        lines = [line for line in out.decode(errors="replace").split("\n") if line]
        if len(lines) > limit:
            raise FileRefused(413, f"{path}: more than {limit} entries")
        return sorted((_parse_stat(line) for line in lines), key=lambda e: e["name"])

    def read(self, path: str, limit: int) -> Iterator[bytes]:
        """The file's bytes in chunks; refused past ``limit`` bytes or when not a file."""
        found = self.stat(path)
        if found["type"] != "file":
            raise FileRefused(400, f"{path}: not a regular file")
        if found["size"] > limit:
            raise FileRefused(413, f"{path}: {found['size']} bytes, over the {limit}-byte cap")
        yield from self._capped(self._start(["cat", "--", _inside(path)], stdin=False), path, limit)

    def write(self, path: str, chunks: Iterator[bytes], limit: int) -> int:
        """Replace ``path`` with the bytes of ``chunks`` at once (a temporary file in the
        same directory, renamed); the bytes written. Refused past ``limit`` bytes."""
        target = _inside(path)
        if target == "/":
            raise FileRefused(400, f"{path!r}: names no file")
        temp = (
            f"{os.path.dirname(target)}/.{os.path.basename(target)}.sandlot-{uuid.uuid4().hex[:8]}"
        )
        process = self._start(["sh", "-c", WRITE_SCRIPT, "sh", temp, target], stdin=True)
        try:
            written = self._feed(process, chunks, path, limit)
            self._finish(process, path)
            return written
        finally:
            self._end(process)

    def mkdir(self, path: str) -> bool:
        """Make the directory ``path`` (its parent must exist); True when made, False
        when a directory was already there. Anything else already there is refused."""
        try:
            self._run(["mkdir", "--", _inside(path)], path, STAT_LINE_MAX)
            return True
        except FileRefused:
            if self.stat(path)["type"] == "dir":
                return False
            raise FileRefused(409, f"{path}: exists and is not a directory") from None

    def remove(self, path: str) -> None:
        tool = "rmdir" if self.stat(path)["type"] == "dir" else "rm"
        self._run([tool, "--", _inside(path)], path, STAT_LINE_MAX)

    # -- one exec -------------------------------------------------------------------------

    def _run(self, argv: Sequence[str], path: str, most: int) -> bytes:
        process = self._start(argv, stdin=False)
        try:
            out = collect(self._stdout(process), most, path)
            self._finish(process, path)
            return out
        finally:
            self._end(process)

    def _start(self, argv: Sequence[str], *, stdin: bool) -> ExecProcess:
        """Start ``argv``; when the image does not link the tool, busybox's applet of
        that name; refused naming the tool when neither is there."""
        try:
            return self._exec(argv, stdin=stdin)
        except MissingTool:
            pass
        try:
            return self._exec(["busybox", *argv], stdin=stdin)
        except MissingTool:
            raise FileRefused(
                501,
                f"the sandbox's image has no {argv[0]} (nor busybox): under this runtime "
                f"handler files and ports are reached with the image's own {TOOLS}",
            ) from None

    def _exec(self, argv: Sequence[str], *, stdin: bool) -> ExecProcess:
        exec_id = f"files-{uuid.uuid4().hex[:12]}"
        try:
            return self.execs.start(
                self.container,
                exec_id,
                list(argv),
                tty=False,
                stdin=stdin,
                timeout=self.call_timeout,
                bare=True,
            )
        except Exception as e:
            if _missing_tool(str(e)):
                raise MissingTool(argv[0]) from None
            raise FileRefused(503, f"cannot reach the sandbox's files: {e}") from None

    def _feed(self, process: ExecProcess, chunks: Iterator[bytes], path: str, limit: int) -> int:
        """Send ``chunks`` to ``process``'s stdin, refused once past ``limit`` bytes,
        then end its stdin and read its output to its end; the bytes sent."""
        written = 0
        assert process.stdin is not None, "started with stdin"
        for chunk in chunks:
            written += len(chunk)
            if written > limit:
                raise FileRefused(413, f"{path}: more than the {limit}-byte cap")
            self._send(process.stdin, chunk, path)
        self.execs.close_stdin(process, timeout=self.call_timeout)
        for _ in self._stdout(process):
            pass
        return written

    def _capped(self, process: ExecProcess, path: str, limit: int) -> Iterator[bytes]:
        """The file ``process`` prints, refused once past ``limit`` bytes; the process
        ended either way."""
        try:
            sent = 0
            for chunk in self._stdout(process):
                sent += len(chunk)
                if sent > limit:
                    raise FileRefused(413, f"{path}: grew past the {limit}-byte cap")
                yield chunk
            self._finish(process, path)
        finally:
            self._end(process)

    def _stdout(self, process: ExecProcess) -> Iterator[bytes]:
        while True:
            ready, _, _ = select.select([process.stdout], [], [], self.idle)
            if not ready:
                raise FileRefused(504, f"the sandbox sent nothing for {self.idle:g}s")
            try:
                chunk = os.read(process.stdout, CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                return
            yield chunk

    def _send(self, fd: int, chunk: bytes, path: str) -> None:
        view = memoryview(chunk)
        while view:
            _, ready, _ = select.select([], [fd], [], self.idle)
            if not ready:
                raise FileRefused(504, f"{path}: the sandbox took nothing for {self.idle:g}s")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise FileRefused(500, f"{path}: the write in the sandbox ended early") from None

    def _finish(self, process: ExecProcess, path: str) -> None:
        code = self.execs.wait(process, timeout=self.call_timeout)
        if code == 0:
            return
        why = stderr_of(process)
        raise FileRefused(_status_of(why), f"{path}: {why or f'exit status {code}'}")

    def _end(self, process: ExecProcess) -> None:
        process.release()
        # Already gone, or the task is: nothing is left to free.
        with contextlib.suppress(Exception):
            self.execs.delete(self.container, process.exec_id, timeout=self.call_timeout)


class PortUnreachable(OSError):
    """The container's ``nc`` could not connect; its message says why."""


class ContainerPort:
    """A TCP connection to ``127.0.0.1:port`` made by the container's own ``nc``, so
    the port is reached on the sandbox's loopback as under runc (gVisor's netstack
    owns it: the node's view of the task's namespace does not). Socket-like for
    ``serve_port``: ``recv``, ``sendall``, ``shutdown``, ``close``."""

    def __init__(self, root: ContainerRoot, argv: Sequence[str]) -> None:
        """``argv`` through ``root``: the image's ``nc 127.0.0.1 PORT``, or the files
        tool's ``connect PORT`` (``agent.toolfiles``)."""
        self.execs = root.execs
        self.call_timeout = root.call_timeout
        self._closed = False
        self._argv0 = argv[0]
        try:
            self.process = root._start(argv, stdin=True)
        except FileRefused as e:
            raise OSError(e.message) from None
        self._root = root

    def recv(self, size: int) -> bytes:
        """Bytes from the port; b"" at its end. ``PortUnreachable`` when ``nc`` ended
        in failure (no connection: nothing listens, or no network), with its why."""
        while not self._closed:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(self.process.stdout, size)
            except BlockingIOError:
                continue
            if not data and not self._closed:
                code = self.execs.wait(self.process, timeout=self.call_timeout)
                if code != 0:
                    said = stderr_of(self.process)
                    status, _, why = said.partition(" ")  # the files tool's "STATUS why"
                    raise PortUnreachable(
                        (why if status.isdigit() else said) or f"{self._argv0} exited with {code}"
                    )
            return data
        return b""

    def sendall(self, data: bytes) -> None:
        assert self.process.stdin is not None, "started with stdin"
        try:
            self._root._send(self.process.stdin, data, "port")
        except FileRefused as e:
            raise OSError(e.message) from None

    def shutdown(self, how: int) -> None:
        with contextlib.suppress(Exception):
            self.execs.close_stdin(self.process, timeout=self.call_timeout)
        if how != socket.SHUT_WR and not self._closed:
            with contextlib.suppress(Exception):
                self.execs.kill(self.process, timeout=self.call_timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.execs.kill(self.process, timeout=self.call_timeout)
        with contextlib.suppress(Exception):
            self.execs.wait(self.process, timeout=self.call_timeout)
        self._root._end(self.process)


class MissingTool(Exception):
    """The exec's program is not in the container."""


def _inside(path: str) -> str:
    """``path`` as an absolute path in the container (``..`` cannot leave its root)."""
    return os.path.normpath("/" + path.strip("/")) if path.strip("/") else "/"


def _missing_tool(message: str) -> bool:
    lowered = message.lower()
    return "executable file not found" in lowered or "no such file or directory" in lowered


def stderr_of(process: ExecProcess) -> str:
    if process.stderr is None:
        return ""
    ready, _, _ = select.select([process.stderr], [], [], 1.0)
    if not ready:
        return ""
    try:
        return os.read(process.stderr, STDERR_MAX).decode(errors="replace").strip()
    except OSError:
        return ""


def _status_of(why: str) -> int:
    lowered = why.lower()
    if "no such file" in lowered or "can't stat" in lowered:
        return 404
    if "permission denied" in lowered or "read-only" in lowered:
        return 403
    if "not empty" in lowered or "exists" in lowered:
        return 409
    return 400


def _parse_stat(line: str) -> dict[str, Any]:
    raw_mode, size, mtime, name = line.split(" ", 3)
    mode = int(raw_mode, 16)
    kind = (
        "dir"
        if stat.S_ISDIR(mode)
        else "file"
        if stat.S_ISREG(mode)
        else "symlink"
        if stat.S_ISLNK(mode)
        else "other"
    )
    return {
        "name": os.path.basename(name),
        "type": kind,
        "size": int(size),
        "mode": stat.S_IMODE(mode),
        "mtime": int(mtime),
    }


def collect(chunks: Iterable[bytes], most: int, path: str) -> bytes:
    """The chunks joined, refused once past ``most`` bytes: a tool in the tenant's
    image chooses how much it prints, and the agent's memory is not the tenant's."""
    out = bytearray()
    for chunk in chunks:
        out += chunk
        if len(out) > most:
            raise FileRefused(413, f"{path}: the sandbox's answer ran past {most} bytes")
    return bytes(out)


__all__ = [
    "ContainerPort",
    "ContainerRoot",
    "MissingTool",
    "PortUnreachable",
    "collect",
    "stderr_of",
]
