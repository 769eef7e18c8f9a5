"""An exec's stdin reaches its end even when containerd does not answer the close
in time, against the real containerd and a frozen shim. The shim holds a writer of
the stdin FIFO until ``Tasks.CloseIO``: a close lost to its deadline left the
command (``cat``) reading forever, so the close is asked again, a bounded number
of times."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.containerd.execs import CLOSE_STDIN_TRIES, ExecProcess, Execs, open_execs
from sandlot.adapters.runtime import ContainerSpec, RuntimeError_, RuntimeTimeout
from tests.support.containerd import (
    PrivateContainerd,
    all_threads_stopped,
    find_shim_pid,
    scratch_spec,
    stopped_process,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

CALL_TIMEOUT = 1.0  # one CloseIO's deadline: the frozen shim outlasts it


@pytest.fixture
def sleeper(
    containerd: PrivateContainerd, runtime: ContainerdRuntime, busybox_image: str, tmp_path: Path
) -> Iterator[tuple[str, int]]:
    """A running container: its id and its shim's pid."""
    container_id = f"stdin-{uuid.uuid4().hex[:8]}"
    spec = scratch_spec(["sleep", "1000"], container_id, host_network=False)
    runtime.create_container(
        ContainerSpec(id=container_id, image=busybox_image, oci_spec=spec), timeout=10
    )
    pid = runtime.start_task(container_id, stdio=f"file://{tmp_path / 'task.log'}", timeout=10).pid
    try:
        yield container_id, find_shim_pid(containerd.address, container_id, pid)
    finally:
        runtime.kill_task(container_id, 9, timeout=5)
        runtime.wait_task(container_id, timeout=10)
        runtime.delete_task(container_id, timeout=5)
        runtime.delete_container(container_id, timeout=5)
        runtime.remove_snapshot(container_id, timeout=5)


@pytest.fixture
def execs(containerd: PrivateContainerd, tmp_path: Path) -> Iterator[Execs]:
    execs = open_execs(containerd.address, containerd.namespace, str(tmp_path / "fifos"))
    try:
        yield execs
    finally:
        execs.close()


@pytest.fixture
def fed_cat(
    sleeper: tuple[str, int], execs: Execs, caplog: pytest.LogCaptureFixture
) -> Iterator[ExecProcess]:
    """``cat`` running in the container, fed a line on its stdin (left open); the
    adapter's warnings captured."""
    caplog.set_level(logging.WARNING, logger="sandlot.adapters.containerd.execs")
    container_id, _ = sleeper
    process = execs.start(
        container_id, f"cat-{uuid.uuid4().hex[:6]}", ["cat"], tty=False, stdin=True, timeout=10
    )
    try:
        assert process.stdin is not None, "started with stdin"
        os.write(process.stdin, b"fed\n")
        yield process
    finally:
        with contextlib.suppress(RuntimeError_):  # already gone: the usual case
            execs.kill(process, timeout=5)
            execs.wait(process, timeout=10)
        execs.delete(process.container_id, process.exec_id, timeout=5)
        process.release()


@contextlib.contextmanager
def frozen(shim: int) -> Iterator[None]:
    """The shim stopped (every thread of it) for the block, thawed after."""
    with stopped_process(shim):
        wait_for(lambda: all_threads_stopped(shim), timeout=10, what=f"shim {shim} stopped")
        yield


def _output(process: ExecProcess) -> bytes:
    chunks = []
    while chunk := os.read(process.stdout, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_close_of_stdin_containerd_did_not_answer_in_time_is_asked_again(
    sleeper: tuple[str, int], execs: Execs, fed_cat: ExecProcess, caplog: pytest.LogCaptureFixture
) -> None:
    _, shim = sleeper
    with ThreadPoolExecutor(1) as pool:
        with frozen(shim):
            closing = pool.submit(execs.close_stdin, fed_cat, timeout=CALL_TIMEOUT)
            wait_for(
                lambda: f"(try 1 of {CLOSE_STDIN_TRIES})" in caplog.text,
                timeout=15,
                what="the first CloseIO given up on its deadline",
            )
        closing.result(timeout=30)  # the next try, with the shim thawed, lands
    assert execs.wait(fed_cat, timeout=30) == 0, "cat did not end well once its stdin closed"
    assert _output(fed_cat) == b"fed\n"


def test_a_close_of_stdin_the_shim_never_answers_gives_up_after_its_tries(
    sleeper: tuple[str, int], execs: Execs, fed_cat: ExecProcess, caplog: pytest.LogCaptureFixture
) -> None:
    _, shim = sleeper
    with frozen(shim), pytest.raises(RuntimeTimeout, match=r"Tasks\.CloseIO"):
        execs.close_stdin(fed_cat, timeout=CALL_TIMEOUT)
    retried = [r.getMessage() for r in caplog.records if "asking again" in r.getMessage()]
    assert len(retried) == CLOSE_STDIN_TRIES - 1, retried
