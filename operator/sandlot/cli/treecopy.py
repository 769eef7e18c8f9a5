"""``sandlot cp`` of files and directories, both ways, with nothing in the image.

Each file operation is a stream of its own (``stat``, ``list``, ``mkdir``, one
``read`` or ``write`` per file) through the API server, opened with one API
client for the whole copy. A tree is walked and checked first
(``policy.treecopy``: bounded, symlinks skipped and named), and only then copied,
directories before files, so a tree that cannot be copied leaves nothing behind.
A copy that fails half-way stops at the first failure and says how much of the
tree was copied (``Progress``).

Out of a sandbox, every local path is the target joined with names the walk has
checked, and a local directory that is already there must be a directory, not a
link to one: a sandbox's listing never makes the CLI write outside the target.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.startup import api_error_line
from sandlot.adapters.streamclient import (
    Stream,
    StreamRefused,
    check_sandbox,
    is_forbidden,
    open_stream,
)
from sandlot.client.commands import read_status, stdout_until_status
from sandlot.policy.streams import (
    FILES,
    LIST,
    MKDIR,
    READ,
    STAT,
    STDIN,
    WRITE,
    StreamRequest,
    api_path,
    close_stdin_frame,
    encode_frame,
)
from sandlot.policy.treecopy import (
    DIR,
    FILE,
    MAX_TREE_ENTRIES,
    OTHER,
    SYMLINK,
    Lister,
    Parts,
    TreePlan,
    TreeRefused,
    copy_root,
    join,
    skipped_line,
    walk_tree,
)

CHUNK = 64 * 1024
IDLE = 300.0  # seconds the CLI waits for the next message of one file operation

Warn = Callable[[str], None]


class CopyFailed(Exception):
    """A file operation that failed; ``status`` is the HTTP code the agent gave (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Progress:
    """How much of a tree has been copied, for the report of a copy that stopped."""

    target: str = ""
    dirs: int = 0
    files: int = 0
    bytes: int = 0
    plan: TreePlan | None = None

    def summary(self) -> str:
        if self.plan is None:
            return ""
        return (
            f"copied {self.dirs} of {len(self.plan.dirs) + 1} directories and {self.files} "
            f"of {len(self.plan.files)} files ({self.bytes} bytes) to {self.target} before "
            "it stopped; the rest was not copied"
        )


class SandboxFiles:
    """One sandbox's files, one stream per operation; ``close()`` when done."""

    def __init__(self, kubeconfig: str | None, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        self._api = load_api_client(kubeconfig)
        try:
            check_sandbox(self._api, namespace, name)
        except Exception as e:
            self._api.close()
            if is_forbidden(e):
                raise StreamRefused(403, api_error_line(e)) from None
            raise

    def close(self) -> None:
        self._api.close()

    def label(self, path: str) -> str:
        return f"{self.name}:{path}"

    def stat(self, path: str) -> dict[str, Any]:
        found: dict[str, Any] = _document(self._call(STAT, path), self.label(path))
        return found

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory to copy into. A refusal (no such file, a
        link out of the root) is a no: the operation that follows says why it fails."""
        try:
            return self.stat(path).get("type") == DIR
        except CopyFailed as e:
            if 400 <= e.status < 500:
                return False
            raise

    def list(self, path: str) -> list[dict[str, Any]]:
        doc = _document(self._call(LIST, path), self.label(path))
        if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
            raise CopyFailed(f"{self.label(path)}: the agent's listing is not a list of entries")
        return doc

    def mkdir(self, path: str) -> None:
        self._call(MKDIR, path)

    def upload(self, local: str, path: str, *, follow: bool) -> int:
        """Write the local file to ``path``; its size. ``follow``: a link named by the
        user is followed, one met in a walk never is."""
        flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            source = os.fdopen(os.open(local, flags), "rb")
        except OSError as e:
            raise CopyFailed(f"{local}: {e.strerror}") from None
        with source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise CopyFailed(f"{local}: not a regular file")
            self._call(WRITE, path, chunks=_read_chunks(source, local))
            return source.tell()

    def download(self, path: str, target: str, mode: int) -> int:
        """Read ``path`` into the local file ``target`` (replaced at once); its size."""
        parent, name = os.path.split(target)
        try:
            fd, temp = tempfile.mkstemp(dir=parent or ".", prefix=f".{name}.")
        except OSError as e:
            raise CopyFailed(f"{target}: {e.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as sink:
                self._call(READ, path, sink=sink)
                os.fchmod(sink.fileno(), mode & 0o777 & ~_umask())
                size = sink.tell()
            os.replace(temp, target)
            return size
        except OSError as e:
            raise CopyFailed(f"{target}: {e.strerror}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def _open(self, op: str, path: str) -> Stream:
        target = api_path(StreamRequest(FILES, self.namespace, self.name, op=op, path=path))
        try:
            try:
                return open_stream(self._api, target)
            except StreamRefused as e:
                # 502: the gateway could not reach the agent, so nothing ran; once more,
                # as the SDK does, since a tree copy opens thousands of streams.
                if e.status != 502:
                    raise
                return open_stream(self._api, target)
        except StreamRefused as e:
            raise CopyFailed(f"{op} {self.label(path)} refused ({e.status}): {e.message}") from None

    def _call(
        self,
        op: str,
        path: str,
        chunks: Iterator[bytes] | None = None,
        sink: BinaryIO | None = None,
    ) -> bytes:
        """One operation to its status; what came on stdout (or went to ``sink``)."""
        stream = self._open(op, path)
        out: list[bytes] = []
        try:
            if chunks is not None:
                _send_all(stream, chunks)
            to = out.append if sink is None else sink.write
            status = stdout_until_status(stream, lambda: IDLE, to)
        except TimeoutError:
            raise CopyFailed(f"{op} {self.label(path)}: no answer for {IDLE:g}s") from None
        finally:
            stream.close()
        outcome = read_status(status)
        if outcome.exit_code != 0:
            said = outcome.message if path in outcome.message else f"{path}: {outcome.message}"
            raise CopyFailed(f"{self.name}:{said}", outcome.code)
        return b"".join(out)


def _send_all(stream: Stream, chunks: Iterator[bytes]) -> None:
    """The chunks on stdin, then its close. A send the agent cut short (it refused the
    write and closed) stops here: its status, read next, says why."""
    for chunk in chunks:
        if not _sent(stream, encode_frame(STDIN, chunk)):
            return
    _sent(stream, close_stdin_frame())


def _sent(stream: Stream, message: bytes) -> bool:
    try:
        stream.send(message)
    except Exception:  # websocket's closed-connection errors are not all OSErrors
        return False
    return True


def _read_chunks(source: BinaryIO, local: str) -> Iterator[bytes]:
    try:
        while chunk := source.read(CHUNK):
            yield chunk
    except OSError as e:
        raise CopyFailed(f"{local}: {e.strerror}") from None


def _document(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise CopyFailed(f"{where}: the agent's answer is not JSON: {raw[:100]!r}") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- into a sandbox --------------------------------------------------------------------


def _local_kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return SYMLINK
    if entry.is_dir(follow_symlinks=False):
        return DIR
    return FILE if entry.is_file(follow_symlinks=False) else OTHER


def local_lister(root: str) -> Lister:
    """The lister of the local tree under ``root`` (never following a link)."""

    def list_dir(parts: Parts) -> list[tuple[str, str]]:
        path = join(root, parts)
        found: list[tuple[str, str]] = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    found.append((entry.name, _local_kind(entry)))
                    if len(found) > MAX_TREE_ENTRIES:
                        break  # enough for the walk to refuse the tree
        except OSError as e:
            raise TreeRefused(f"{path}: {e.strerror}") from None
        return found

    return list_dir


def copy_in(files: SandboxFiles, local: str, dest: str, progress: Progress, warn: Warn) -> None:
    """``sandlot cp LOCAL SANDBOX:DEST``, a file or a whole directory."""
    if not os.path.isdir(local):
        if not os.path.isfile(local):
            raise CopyFailed(f"{local}: not a regular file or directory")
        target = copy_root(os.path.abspath(local), dest, files.is_dir(dest))
        files.upload(local, target, follow=True)
        return
    plan = walk_tree(local, local_lister(local))
    for path, kind in plan.skipped:
        warn(skipped_line(local, path, kind))
    target = copy_root(os.path.abspath(local), dest, files.is_dir(dest))
    progress.target, progress.plan = files.label(target), plan
    for parts in ((), *plan.dirs):
        files.mkdir(join(target, parts))
        progress.dirs += 1
    for parts in plan.files:
        progress.bytes += files.upload(join(local, parts), join(target, parts), follow=False)
        progress.files += 1


# -- out of a sandbox ------------------------------------------------------------------


def remote_lister(files: SandboxFiles, root: str, modes: dict[Parts, int]) -> Lister:
    """The lister of the sandbox's tree under ``root``; records each entry's mode."""

    def list_dir(parts: Parts) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for doc in files.list(join(root, parts)):
            name, kind = doc.get("name"), doc.get("type")
            if not isinstance(name, str) or not isinstance(kind, str):
                raise CopyFailed(f"{files.label(join(root, parts))}: an entry without a name")
            found.append((name, kind))
            with contextlib.suppress(TypeError, ValueError):
                modes[(*parts, name)] = int(doc.get("mode", 0o644))
        return found

    return list_dir


def _make_local_dir(path: str) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise CopyFailed(f"{path}: exists and is not a directory") from None
    except OSError as e:
        raise CopyFailed(f"{path}: {e.strerror}") from None


def copy_out(files: SandboxFiles, source: str, local: str, progress: Progress, warn: Warn) -> None:
    """``sandlot cp SANDBOX:SOURCE LOCAL``, a file or a whole directory."""
    info = files.stat(source)
    kind = info.get("type")
    if kind not in (FILE, DIR):
        raise CopyFailed(f"{files.label(source)}: a {kind}, not a regular file or directory")
    target = copy_root(source, local, os.path.isdir(local))
    if kind == FILE:
        files.download(source, target, int(info.get("mode", 0o644)))
        return
    modes: dict[Parts, int] = {}
    plan = walk_tree(files.label(source), remote_lister(files, source, modes))
    for path, what in plan.skipped:
        warn(skipped_line(files.label(source), path, what))
    progress.target, progress.plan = target, plan
    for parts in ((), *plan.dirs):
        _make_local_dir(join(target, parts))
        progress.dirs += 1
    for parts in plan.files:
        mode = modes.get(parts, 0o644)
        progress.bytes += files.download(join(source, parts), join(target, parts), mode)
        progress.files += 1


__all__ = [
    "CopyFailed",
    "Progress",
    "SandboxFiles",
    "copy_in",
    "copy_out",
    "local_lister",
    "remote_lister",
]
