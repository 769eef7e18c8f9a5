"""The files tool (``operator/filetool``) against the real kernel, run as a sandbox
runs it: chrooted into a root of the test's own, so ``/`` is that root. Its paths
resolve beneath it (``openat2`` RESOLVE_BENEATH), a mkdir makes exactly a new
``0755`` directory, and a write that does not finish leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.agent.toolfiles import tool_refusal
from sandlot.devtools.controlplane import files_tool_path
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration]

TOOL = "/.files"


@pytest.fixture(scope="module")
def built() -> Path:
    return files_tool_path()


@pytest.fixture
def root(tmp_path: Path, built: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("running the tool chrooted needs root")
    inside = tmp_path / "root"
    inside.mkdir()
    shutil.copy2(built, inside / TOOL.lstrip("/"))
    (tmp_path / "outside").mkdir()
    (inside / "tmp").mkdir()
    (inside / "tmp" / "file").write_text("x")
    (inside / "tmp" / "up").symlink_to("/")
    (inside / "tmp" / "rel-up").symlink_to("../../..")
    (inside / "tmp" / "to-outside").symlink_to(tmp_path / "outside")
    yield inside
    assert list((tmp_path / "outside").iterdir()) == [], "nothing was made outside the root"


def _tool(inside: Path, *argv: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["chroot", str(inside), TOOL, *argv],
        input=data,
        capture_output=True,
        timeout=30,
        check=False,
        preexec_fn=lambda: os.umask(0o077),  # the caller's umask decides no mode
    )


def test_mkdir_makes_a_0755_directory_and_again_is_no_error(root: Path) -> None:
    made = _tool(root, "mkdir", "/tmp/new")
    assert (made.returncode, made.stdout) == (0, b"1"), made
    st = os.lstat(root / "tmp" / "new")
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755
    again = _tool(root, "mkdir", "/tmp/new/")
    assert (again.returncode, again.stdout) == (0, b"0"), again


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        (("mkdir", "/tmp/file"), 409, "/tmp/file: exists and is not a directory"),
        (("mkdir", "/tmp/up"), 409, "/tmp/up: exists and is not a directory"),
        (("mkdir", "/tmp/up/escaped"), 403, "outside the sandbox's root"),
        (("mkdir", "/tmp/rel-up/escaped"), 403, "outside the sandbox's root"),
        (("mkdir", "/tmp/to-outside/escaped"), 403, "outside the sandbox's root"),
        (("mkdir", "/../../escaped"), 403, "outside the sandbox's root"),
        (("mkdir", "/tmp/missing/new"), 404, "no such file or directory"),
        (("mkdir", "/"), 400, "names no file"),
        (("write", "/tmp/to-outside/escaped", "100"), 403, "outside the sandbox's root"),
        (("read", "/tmp", "100"), 400, "/tmp: not a regular file"),
        (("read", "/tmp/file", "0"), 413, "/tmp/file: 1 bytes, over the 0-byte cap"),
        (("list", "/tmp", "2"), 413, "/tmp: more than 2 entries"),
        (("remove", "/tmp/rel-up/x"), 403, "outside the sandbox's root"),
    ],
    ids=[
        "mkdir-a-file",
        "mkdir-a-symlink",
        "mkdir-through-an-absolute-link",
        "mkdir-through-a-relative-link",
        "mkdir-through-a-link-to-the-host",
        "mkdir-dotdot",
        "mkdir-no-parent",
        "mkdir-the-root",
        "write-through-a-link-to-the-host",
        "read-a-directory",
        "read-past-the-cap",
        "list-past-the-cap",
        "remove-through-a-relative-link",
    ],
)
def test_the_tool_refuses_with_a_status_and_why(
    root: Path, argv: tuple[str, ...], status: int, said: str
) -> None:
    done = _tool(root, *argv)
    assert done.returncode == 1, done
    refused = tool_refusal(done.stderr.decode().strip(), argv[1], done.returncode)
    assert (refused.status, said in refused.message) == (status, True), refused.message


def test_a_write_past_its_cap_leaves_nothing(root: Path) -> None:
    done = _tool(root, "write", "/tmp/big", "10", data=b"x" * 11)
    assert done.returncode == 1 and done.stderr.startswith(b"413 "), done
    assert sorted(p.name for p in (root / "tmp").iterdir()) == [
        "file",
        "rel-up",
        "to-outside",
        "up",
    ]


def test_a_write_ended_by_sigterm_leaves_nothing(root: Path) -> None:
    """How the agent ends a write whose client left or went silent."""
    writer = subprocess.Popen(
        ["chroot", str(root), TOOL, "write", "/tmp/half", "1000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert writer.stdin is not None
    writer.stdin.write(b"half of it")
    writer.stdin.flush()
    wait_for(
        lambda: any(p.name.startswith(".half.sandlot-") for p in (root / "tmp").iterdir()),
        timeout=10,
        what="the tool's temporary file",
    )
    writer.send_signal(signal.SIGTERM)
    assert writer.wait(timeout=10) == 1
    writer.stdin.close()
    names = sorted(p.name for p in (root / "tmp").iterdir())
    assert names == ["file", "rel-up", "to-outside", "up"], names


def test_a_write_replaces_the_file_at_once(root: Path) -> None:
    done = _tool(root, "write", "/tmp/up", "100", data=b"new bytes\n")
    # Replacing the link itself is inside the root: the link goes, its target stays.
    assert (done.returncode, done.stdout) == (0, b"10"), done
    assert (root / "tmp" / "up").read_bytes() == b"new bytes\n"
    listed = _tool(root, "list", "/tmp", "10")
    entries = {e["name"]: e["type"] for e in json.loads(listed.stdout)}
    assert entries == {"file": "file", "rel-up": "symlink", "to-outside": "symlink", "up": "file"}
