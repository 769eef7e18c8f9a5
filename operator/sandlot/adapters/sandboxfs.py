"""A sandbox's files and ports, reached from its node without anything in its image.

Files: the root of a running sandbox is ``<proc>/<pid>/root`` of its task (the
kernel's view of the container's mount namespace), so reading or writing needs
no shell, no ``tar``, nothing in the image (distroless works). Every path is
resolved by ``openat2(2)`` with ``RESOLVE_BENEATH``: a ``..`` or a symlink that
would leave the sandbox's root (``/etc/shadow`` of the node, say) fails with
``EXDEV`` and is refused, never followed; magic links (``/proc/self/...``) are
refused too. Writes go to a temporary file in the same directory, then a rename:
a reader sees the old file or the new one, never half of it; they belong to the
sandbox's own user (its host uid and gid, so user namespaces map them).

Ports: a connection to a port of the sandbox's network namespace
(``<proc>/<pid>/ns/net``), made by a thread that joins that namespace just long
enough to create the socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import stat
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SYS_OPENAT2 = 437  # x86_64 and aarch64 alike
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
CLONE_NEWNET = 0x40000000
CHUNK = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class FileRefused(Exception):
    """A file operation refused: an HTTP status and why (for the user)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _refusal(e: OSError, path: str) -> FileRefused:
    if e.errno == errno.EXDEV:
        return FileRefused(403, f"{path}: resolves outside the sandbox's root (refused)")
    if e.errno == errno.ELOOP:
        return FileRefused(403, f"{path}: a link that cannot be followed here (refused)")
    if e.errno == errno.ENOENT:
        return FileRefused(404, f"{path}: no such file or directory")
    if e.errno in (errno.EACCES, errno.EPERM):
        return FileRefused(403, f"{path}: permission denied")
    if e.errno == errno.EISDIR:
        return FileRefused(400, f"{path}: is a directory")
    if e.errno == errno.ENOTDIR:
        return FileRefused(400, f"{path}: a part of it is not a directory")
    if e.errno == errno.ENOTEMPTY:
        return FileRefused(409, f"{path}: directory not empty")
    return FileRefused(500, f"{path}: {os.strerror(e.errno or 0)}")


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _relative(path: str) -> str:
    inside = path.lstrip("/")
    return inside or "."


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int


def task_owner(proc: str, pid: int) -> Owner:
    """The host uid and gid of the task's process (user namespaces already mapped)."""
    uid = gid = 0
    with open(f"{proc}/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
            elif line.startswith("Gid:"):
                gid = int(line.split()[1])
    return Owner(uid, gid)


class SandboxRoot:
    """The root directory of a running task; ``close()`` when done."""

    def __init__(self, proc: str, pid: int) -> None:
        self.owner = task_owner(proc, pid)
        self._fd = os.open(f"{proc}/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def _open(self, path: str, flags: int, mode: int = 0) -> int:
        try:
            return _openat2(self._fd, _relative(path), flags, mode)
        except OSError as e:
            raise _refusal(e, path) from None

    def stat(self, path: str) -> dict[str, Any]:
        fd = self._open(path, os.O_PATH)
        try:
            return _describe(os.path.basename(path.rstrip("/")) or "/", os.fstat(fd))
        finally:
            os.close(fd)

    def list(self, path: str, limit: int) -> list[dict[str, Any]]:
        fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            entries: list[dict[str, Any]] = []
            with os.scandir(fd) as it:
                for entry in it:
                    if len(entries) >= limit:
                        raise FileRefused(413, f"{path}: more than {limit} entries")
                    st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                    entries.append(_describe(entry.name, st))
            return sorted(entries, key=lambda e: e["name"])
        except OSError as e:
            raise _refusal(e, path) from None
        finally:
            os.close(fd)

    def read(self, path: str, limit: int) -> Iterator[bytes]:
        """The file's bytes in chunks; refused past ``limit`` bytes or when not a file."""
        fd = self._open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileRefused(400, f"{path}: not a regular file")
            if st.st_size > limit:
                raise FileRefused(413, f"{path}: {st.st_size} bytes, over the {limit}-byte cap")
            sent = 0
            while chunk := os.read(fd, CHUNK):
                sent += len(chunk)
                if sent > limit:
                    raise FileRefused(413, f"{path}: grew past the {limit}-byte cap")
                yield chunk
        finally:
            os.close(fd)

    def write(self, path: str, chunks: Iterator[bytes], limit: int, mode: int = 0o644) -> int:
        """Replace ``path`` with the bytes of ``chunks`` at once (a temporary file in the
        same directory, renamed); the bytes written. Refused past ``limit`` bytes."""
        parent, name = _split(path)
        dirfd = self._open(parent, os.O_RDONLY | os.O_DIRECTORY)
        temp = f".{name}.sandlot-{uuid.uuid4().hex[:8]}"
        try:
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode, dir_fd=dirfd
            )
            written = 0
            try:
                for chunk in chunks:
                    written += len(chunk)
                    if written > limit:
                        raise FileRefused(413, f"{path}: more than the {limit}-byte cap")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                os.fchown(fd, self.owner.uid, self.owner.gid)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            temp = ""
            return written
        except OSError as e:
            raise _refusal(e, path) from None
        finally:
            if temp:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dirfd)
            os.close(dirfd)

    def mkdir(self, path: str, mode: int = 0o755) -> bool:
        """Make the directory ``path`` (its parent must exist), owned by the sandbox's
        user; True when made, False when a directory was already there (left as it is).
        Anything else already there, a symlink included, is refused."""
        parent, name = _split(path)
        dirfd = self._open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                os.mkdir(name, mode, dir_fd=dirfd)
            except FileExistsError:
                if stat.S_ISDIR(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                    return False
                raise FileRefused(409, f"{path}: exists and is not a directory") from None
            # Opened again without following anything: the sandbox may have swapped
            # the new directory for a link in between, and the link is then refused.
            fd = _openat2(dirfd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchown(fd, self.owner.uid, self.owner.gid)
                os.fchmod(fd, mode)  # the agent's umask does not decide the sandbox's mode
            finally:
                os.close(fd)
            return True
        except OSError as e:
            raise _refusal(e, path) from None
        finally:
            os.close(dirfd)

    def remove(self, path: str) -> None:
        parent, name = _split(path)
        dirfd = self._open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(name, dir_fd=dirfd)
            else:
                os.unlink(name, dir_fd=dirfd)
        except OSError as e:
            raise _refusal(e, path) from None
        finally:
            os.close(dirfd)


def _split(path: str) -> tuple[str, str]:
    inside = path.strip("/")
    parent, _, name = inside.rpartition("/")
    if name in ("", ".", ".."):
        raise FileRefused(400, f"{path!r}: names no file")
    return parent or ".", name


def _describe(name: str, st: os.stat_result) -> dict[str, Any]:
    kind = (
        "dir"
        if stat.S_ISDIR(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "symlink"
        if stat.S_ISLNK(st.st_mode)
        else "other"
    )
    return {
        "name": name,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": int(st.st_mtime),
    }


def connect_in_netns(proc: str, pid: int, port: int, *, timeout: float) -> socket.socket:
    """A TCP connection to ``127.0.0.1:port`` inside the task's network namespace."""
    result: list[socket.socket | BaseException] = []

    def inside() -> None:
        try:
            target = os.open(f"{proc}/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(target, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
            finally:
                os.close(target)
            # This thread ends right after: its namespace goes with it.
            result.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except BaseException as e:  # handed to the caller
            result.append(e)

    thread = threading.Thread(target=inside, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if not result:
        raise TimeoutError(f"no connection to port {port} within {timeout:g}s")
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    outcome.settimeout(None)
    return outcome


__all__ = ["FileRefused", "Owner", "SandboxRoot", "connect_in_netns", "task_owner"]
