"""Idle streams time out, end to end: the CLI, the real API server, the stream
gateway, an agent whose ``stream_idle_timeout`` is 2 s and the real containerd.

An exec in which nothing moves is killed and says why; one that keeps printing,
or keeps being fed stdin, runs past the timeout to its exit. A ``logs -f`` of a
quiet sandbox ends with the timeout's message; one of a sandbox that keeps
writing does not. The rig is ``tests/support/streams.py``'s; only the agent here
is its own, for the short timeout.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from tests.support.streams import (
    StartStreamAgent,
    delete_sandbox,
    running_sandbox,
    sandlot,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

IDLE = 2.0  # the agent's stream_idle_timeout here
# An idle session ends within IDLE plus one exec wait slice (1 s) or a few follow
# waits, plus the CLI's start and the relay; far less than this.
ENDS_WITHIN = 25.0
EXEC_IDLE = f"no input or output for {IDLE:g}s: the exec session timed out"
FOLLOW_IDLE = f"no output for {IDLE:g}s: the log follow timed out"


@pytest.fixture(scope="module")
def agent(start_stream_agent: StartStreamAgent) -> Agent:
    """The stream rig's agent (tests/support/streams.py), with a 2 s idle timeout."""
    return start_stream_agent("idle", stream_idle_timeout=f"{IDLE:g}s", log_interval="0.2s")


def _timed(
    command: str, *args: str, kubeconfig: Path, within: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``sandlot COMMAND ...`` and how long it took; fails clearly past ``within``."""
    began = time.monotonic()
    try:
        done = sandlot(command, *args, kubeconfig=kubeconfig, timeout=within)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"sandlot {command} {' '.join(args)} still ran after {within:g}s "
            f"(idle timeout {IDLE:g}s): stdout {e.stdout!r}, stderr {e.stderr!r}"
        )
    return done, time.monotonic() - began


def _cli(command: str, *args: str, kubeconfig: Path, stdin: int) -> subprocess.Popen[bytes]:
    """``sandlot COMMAND --kubeconfig FILE ARGS...`` running, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "sandlot.cli.main", command, "--kubeconfig", str(kubeconfig), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=stdin,
    )


def _finish(proc: subprocess.Popen[bytes], within: float, what: str) -> tuple[int, bytes]:
    """The exit code and stderr of ``proc``; fails clearly if it runs past ``within``."""
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"{what} still ran after {within:g}s; stderr {err!r}")
    return proc.returncode, err


def test_an_exec_with_no_input_or_output_is_killed_and_says_why(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "quiet-exec", "sleep 1000")
    kubeconfig = users["operator-person"]
    done, took = _timed(
        "exec",
        "quiet-exec",
        "-n",
        tenant,
        "--",
        "sleep",
        "60",
        kubeconfig=kubeconfig,
        within=ENDS_WITHIN,
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert EXEC_IDLE in done.stderr, f"the CLI said {done.stderr!r} after {took:.1f}s"
    assert took >= IDLE, f"ended after {took:.1f}s, before the {IDLE:g}s timeout"

    def sleep_gone() -> bool:
        ps = sandlot("exec", "quiet-exec", "-n", tenant, "--", "ps", kubeconfig=kubeconfig)
        assert ps.returncode == 0, f"ps in the sandbox failed: {ps.stderr!r}"
        assert "sleep 60" not in ps.stdout, f"the timed-out exec still runs:\n{ps.stdout}"
        return True

    wait_for(sleep_gone, timeout=15, what="the timed-out exec's `sleep 60` to be gone")
    delete_sandbox(kube, tenant, "quiet-exec")


def test_an_exec_that_keeps_printing_or_reading_outlives_the_timeout(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "busy-exec", "sleep 1000")
    kubeconfig = users["operator-person"]
    script = "for i in 1 2 3 4 5 6 7 8; do echo tick-$i; sleep 0.5; done"
    done, took = _timed(
        "exec",
        "busy-exec",
        "-n",
        tenant,
        "--",
        "sh",
        "-c",
        script,
        kubeconfig=kubeconfig,
        within=ENDS_WITHIN,
    )
    assert (done.returncode, done.stderr) == (0, ""), f"cut after {took:.1f}s: {done.stderr!r}"
    assert done.stdout.split() == [f"tick-{i}" for i in range(1, 9)]

    # Silent output, but stdin fed every 0.5 s for 4 s: input counts as activity.
    proc = _cli(
        "exec",
        "busy-exec",
        "-n",
        tenant,
        "-i",
        "--",
        "sh",
        "-c",
        "cat >/dev/null; echo fed",
        kubeconfig=kubeconfig,
        stdin=subprocess.PIPE,
    )
    assert proc.stdin is not None
    try:
        for i in range(8):
            assert proc.poll() is None, f"the exec ended while being fed, at line {i}"
            proc.stdin.write(f"line-{i}\n".encode())
            proc.stdin.flush()
            time.sleep(0.5)  # the pace of the input under test, not a wait for a state
        # communicate() closes stdin: the end of input ends cat, and so the exec.
        code, err = _finish(proc, ENDS_WITHIN, "the fed exec after its stdin closed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 0, f"the fed exec was cut: {err!r}"
    delete_sandbox(kube, tenant, "busy-exec")


def test_a_follow_of_a_quiet_sandbox_ends_with_the_timeout(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "quiet-log", "echo started; sleep 1000")
    kubeconfig = users["operator-person"]

    def started_logged() -> bool:
        done = sandlot("logs", "quiet-log", "-n", tenant, kubeconfig=kubeconfig)
        assert done.returncode == 0, done.stderr
        return done.stdout == "started\n"

    wait_for(started_logged, timeout=20, what="the sandbox's one line in its log")
    done, took = _timed(
        "logs", "quiet-log", "-n", tenant, "-f", kubeconfig=kubeconfig, within=ENDS_WITHIN
    )
    assert (done.returncode, done.stdout) == (1, "started\n"), done.stderr
    assert FOLLOW_IDLE in done.stderr, f"the CLI said {done.stderr!r} after {took:.1f}s"
    assert took >= IDLE, f"ended after {took:.1f}s, before the {IDLE:g}s timeout"
    delete_sandbox(kube, tenant, "quiet-log")


def test_a_follow_of_a_sandbox_that_keeps_writing_is_not_cut(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    running_sandbox(
        kube,
        agent,
        tenant,
        "ticking-log",
        "i=0; while true; do i=$((i+1)); echo t-$i; sleep 0.5; done",
    )
    proc = _cli(
        "logs",
        "ticking-log",
        "-n",
        tenant,
        "-f",
        kubeconfig=users["operator-person"],
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both PIPE
    try:
        seen = b""
        first: float | None = None
        deadline = time.monotonic() + 30
        # Output for twice the idle timeout after the first bytes, the stream open all along.
        while first is None or time.monotonic() - first < 2 * IDLE:
            assert time.monotonic() < deadline, f"the follow showed only {seen[-200:]!r}"
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"the follow ended: {proc.stderr.read()!r}"
                seen += chunk
                first = first or time.monotonic()
        assert proc.poll() is None, f"the follow ended: {proc.stderr.read()!r}"
        delete_sandbox(kube, tenant, "ticking-log")
        code, err = _finish(proc, 30, "the follow after its sandbox was deleted")
        assert code == 0, f"the follow of a deleted sandbox ended with {code}: {err!r}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
