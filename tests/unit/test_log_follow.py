"""``sandlot logs -f`` on the agent: a followed file that grows, rotates and ends.

Real files in a temporary directory; the connection is two callables (``send``
collects frames, ``wait`` stands for a bounded receive and acts on the file), so
nothing here sleeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from sandlot.adapters.logfiles import CappedLog
from sandlot.agent.logstream import ClientGone, stream_log
from sandlot.policy.streams import STDOUT, decode_frame


def _follow(path: Path, steps: Sequence[Callable[[], object]], tail: int | None = None) -> bytes:
    """Follow ``path``; each wait runs the next step; the sandbox ends after the last."""
    sent: list[bytes] = []
    pending = list(steps)

    def wait(_seconds: float) -> None:
        if pending:
            pending.pop(0)()

    stream_log(
        path,
        tail=tail,
        follow=True,
        running=lambda: bool(pending),
        send=sent.append,
        wait=wait,
        stopping=lambda: False,
    )
    frames = [decode_frame(m) for m in sent]
    assert {channel for channel, _ in frames} <= {STDOUT}
    return b"".join(data for _, data in frames)


def test_follow_sends_what_is_appended_until_the_sandbox_ends(tmp_path: Path) -> None:
    log = tmp_path / "ns_box_uid.log"
    log.write_bytes(b"one\n")

    def append(data: bytes) -> Callable[[], object]:
        return lambda: log.open("ab").write(data)

    assert _follow(log, [append(b"two\n"), append(b"three\n")]) == b"one\ntwo\nthree\n"


def test_a_rotation_sends_the_rest_of_the_old_generation_then_the_new_file(tmp_path: Path) -> None:
    log = tmp_path / "ns_box_uid.log"
    writer = CappedLog(log, max_bytes=8)
    writer.write(b"one\n")

    def rotate_with_unsent_bytes() -> None:
        # "two\n" fills the file to its cap after the last read; "three\n" crosses
        # it: the file becomes .log.1 and "three\n" starts the new one.
        writer.write(b"two\nthree\n")

    assert _follow(log, [rotate_with_unsent_bytes]) == b"one\ntwo\nthree\n"
    assert (tmp_path / "ns_box_uid.log.1").read_bytes() == b"one\ntwo\n"


def test_two_rotations_between_looks_lose_only_the_generation_no_longer_kept(
    tmp_path: Path,
) -> None:
    """One previous generation is kept: a follower that sleeps through two rotations
    finds its open file gone (as .log.1 was replaced), sends what it still holds,
    and goes on in the newest one."""
    log = tmp_path / "ns_box_uid.log"
    writer = CappedLog(log, max_bytes=4)
    writer.write(b"aaa\n")
    out = _follow(log, [lambda: writer.write(b"bbbbcccc")])
    assert out.startswith(b"aaa\n") and out.endswith(b"cccc")
    assert b"bbbb" not in out  # written and rotated away between two looks


def test_tail_then_follow_starts_at_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "ns_box_uid.log"
    log.write_bytes(b"a\nb\nc\n")
    assert _follow(log, [lambda: log.open("ab").write(b"d\n")], tail=1) == b"c\nd\n"


def test_the_file_removed_at_teardown_ends_the_follow(tmp_path: Path) -> None:
    log = tmp_path / "ns_box_uid.log"
    log.write_bytes(b"one\n")
    steps = [log.unlink, lambda: None]  # still "running" when the file is found gone
    assert _follow(log, steps) == b"one\n"


def test_a_client_that_left_ends_the_follow(tmp_path: Path) -> None:
    log = tmp_path / "ns_box_uid.log"
    log.write_bytes(b"one\n")

    def gone(_seconds: float) -> None:
        raise ClientGone("closed")

    with pytest.raises(ClientGone):
        stream_log(
            log,
            tail=None,
            follow=True,
            running=lambda: True,
            send=lambda _m: None,
            wait=gone,
            stopping=lambda: False,
        )


def test_a_tail_of_a_gigabyte_without_a_newline_reads_a_bounded_window(tmp_path: Path) -> None:
    """A tenant writes 1 GiB without a newline, then asks for ``--tail 10``: the agent
    reads back at most ``TAIL_MAX`` bytes and sends only those."""
    import tracemalloc

    from sandlot.agent.logstream import TAIL_MAX

    log = tmp_path / "flood.log"
    with open(log, "wb") as f:
        f.truncate(2**30)  # zeros, no newline anywhere (sparse: costs no disk)
    sent: list[bytes] = []
    tracemalloc.start()
    try:
        stream_log(
            log,
            tail=10,
            follow=False,
            running=lambda: False,
            send=sent.append,
            wait=lambda _: None,
            stopping=lambda: False,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(len(m) - 1 for m in sent) == TAIL_MAX
    assert all(decode_frame(m)[0] == STDOUT for m in sent)
    assert peak < 4 * TAIL_MAX, f"the tail read {peak} bytes into memory"
