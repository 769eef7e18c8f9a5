"""``SandboxRoot.mkdir`` against the real kernel: a stand-in ``/proc/PID`` whose
``root`` is a directory of the test's own, resolved with ``openat2`` exactly as a
sandbox's root is."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.adapters.sandboxfs import FileRefused, SandboxRoot

PID = 4242


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[SandboxRoot, Path]]:
    proc = tmp_path / "proc"
    inside = proc / str(PID) / "root"
    inside.mkdir(parents=True)
    (proc / str(PID) / "status").write_text(
        f"Name:\tsh\nUid:\t{os.getuid()}\t0\t0\t0\nGid:\t{os.getgid()}\t0\t0\t0\n"
    )
    (tmp_path / "outside").mkdir()
    (inside / "tmp").mkdir()
    (inside / "tmp" / "file").write_text("x")
    (inside / "tmp" / "up").symlink_to("/")
    (inside / "tmp" / "rel-up").symlink_to("../../..")
    (inside / "tmp" / "to-outside").symlink_to(tmp_path / "outside")
    sandbox = SandboxRoot(str(proc), PID)
    try:
        yield sandbox, inside
    finally:
        sandbox.close()


def test_mkdir_makes_a_0755_directory_and_again_is_no_error(
    root: tuple[SandboxRoot, Path],
) -> None:
    sandbox, inside = root
    old = os.umask(0o077)  # the agent's umask does not decide the mode
    try:
        assert sandbox.mkdir("/tmp/new") is True
    finally:
        os.umask(old)
    made = os.lstat(inside / "tmp" / "new")
    assert stat.S_ISDIR(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o755
    assert (made.st_uid, made.st_gid) == (os.getuid(), os.getgid())
    assert sandbox.mkdir("/tmp/new/") is False


@pytest.mark.parametrize(
    ("path", "status", "said"),
    [
        ("/tmp/file", 409, "/tmp/file: exists and is not a directory"),
        ("/tmp/up", 409, "/tmp/up: exists and is not a directory"),
        ("/tmp/up/escaped", 403, "outside the sandbox's root"),
        ("/tmp/rel-up/escaped", 403, "outside the sandbox's root"),
        ("/tmp/to-outside/escaped", 403, "outside the sandbox's root"),
        ("/../../escaped", 403, "outside the sandbox's root"),
        ("/tmp/missing/new", 404, "no such file or directory"),
        ("/", 400, "names no file"),
    ],
    ids=[
        "a-file",
        "a-symlink",
        "through-an-absolute-link",
        "through-a-relative-link",
        "through-a-link-to-the-host",
        "dotdot",
        "no-parent",
        "the-root",
    ],
)
def test_mkdir_refuses_what_is_not_a_new_directory_beneath_the_root(
    root: tuple[SandboxRoot, Path], path: str, status: int, said: str
) -> None:
    sandbox, inside = root
    with pytest.raises(FileRefused) as refused:
        sandbox.mkdir(path)
    assert (refused.value.status, said in refused.value.message) == (status, True), refused.value
    outside = inside.parents[2] / "outside"
    assert list(outside.iterdir()) == []
