"""Liveness on the operator's monotonic clock, against the real API server: a real
``sandlot operator`` whose wall clock is stepped 10 minutes either way mid-run (an
NTP step, a VM resumed with time sync), its monotonic clock untouched. Agents renew
their Leases every 2 s; lease 6 s, grace 5 s.

The step is made by a ``sitecustomize`` on the operator's PYTHONPATH that offsets
``time.time``, ``time.time_ns`` and ``datetime.datetime.now``/``utcnow`` by the
seconds a file says, re-read when the file changes, and acknowledges each new
offset in a second file (libfaketime cannot be used: it breaks ``time.sleep``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.api.timestamps import parse_time
from sandlot.devtools.controlplane import ControlPlane
from tests.support.operator import AgentLease, Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LEASE, GRACE, RENEW_EVERY = 6, 5, 2.0
FLAGS = ("--grace-period", f"{GRACE}s", "--resync-interval", "1s")
STEP = 600.0  # seconds: ten minutes
RECONCILES = "sandlot_operator_node_reconcile_duration_seconds_count"

SITECUSTOMIZE = '''\
"""Offsets this process's wall clock by the seconds in $SANDLOT_TEST_WALL_OFFSET."""
import datetime as _dt
import os as _os
import time as _time

_PATH = _os.environ["SANDLOT_TEST_WALL_OFFSET"]
_real_time, _real_time_ns = _time.time, _time.time_ns
_seen = {"key": None, "offset": 0.0}


def _offset():
    try:
        st = _os.stat(_PATH)
    except OSError:
        return _seen["offset"]
    key = (st.st_ino, st.st_mtime_ns)
    if key != _seen["key"]:
        with open(_PATH) as f:
            text = f.read().strip()
        _seen["key"], _seen["offset"] = key, float(text)
        with open(_PATH + ".applied.tmp", "w") as f:
            f.write(text)
        _os.replace(_PATH + ".applied.tmp", _PATH + ".applied")
    return _seen["offset"]


def _stepped_time():
    return _real_time() + _offset()


def _stepped_time_ns():
    return _real_time_ns() + int(_offset() * 1e9)


_time.time, _time.time_ns = _stepped_time, _stepped_time_ns
_Real = _dt.datetime


class _Meta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _Real)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _Real)


class _SteppedDatetime(_Real, metaclass=_Meta):
    @classmethod
    def now(cls, tz=None):
        return _Real.fromtimestamp(_stepped_time(), tz)

    @classmethod
    def utcnow(cls):
        return _Real.fromtimestamp(_stepped_time(), _dt.timezone.utc).replace(tzinfo=None)


_dt.datetime = _SteppedDatetime
'''


class SteppedClock:
    """The operator's wall-clock offset, as the file its ``sitecustomize`` reads."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "stepped"
        self.dir.mkdir()
        (self.dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.file = self.dir / "offset"
        self.set(0.0)

    @property
    def env(self) -> dict[str, str]:
        return {
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(self.dir), os.environ.get("PYTHONPATH")])
            ),
            "SANDLOT_TEST_WALL_OFFSET": str(self.file),
        }

    def set(self, seconds: float) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(repr(seconds))
        os.replace(tmp, self.file)

    def step(self, seconds: float, timeout: float = 10) -> float:
        """Step the operator's wall clock to ``seconds`` off; wait until it applied it.
        Returns when it did (``time.monotonic()``)."""
        self.set(seconds)
        applied = self.file.with_name("offset.applied")
        wait_for(
            lambda: applied.exists() and applied.read_text() == repr(seconds),
            timeout=timeout,
            what=f"the operator to apply a wall-clock offset of {seconds:+.0f}s",
            interval=0.02,
        )
        return time.monotonic()


@pytest.fixture
def stepped(
    control_plane: ControlPlane, tmp_path: Path, lease_namespace: str
) -> Iterator[tuple[SteppedClock, OperatorProcess]]:
    clock = SteppedClock(tmp_path)
    op = OperatorProcess(control_plane, tmp_path, lease_namespace, *FLAGS, env=clock.env)
    try:
        op.wait_metrics()
        clock.step(0.0)  # the sitecustomize is loaded and reads its file
        yield clock, op
    finally:
        op.stop()


def renewing(fleet: Fleet, node: str) -> AgentLease:
    lease = AgentLease(fleet.api, fleet.lease_namespace, node, duration=LEASE, every=RENEW_EVERY)
    fleet.leases.append(lease)
    return lease


def node_phase(fleet: Fleet, node: str) -> str | None:
    return (fleet.get_node(node).get("status") or {}).get("phase")


def wait_ready(fleet: Fleet, op: OperatorProcess, nodes: list[str]) -> None:
    """Every node in ``nodes`` Ready (their agents renew): the start every test needs.
    A loaded machine starts the operator slowly; a timeout names each node's phase
    and ends with the operator's log."""

    def ready() -> bool:
        phases = {n: node_phase(fleet, n) for n in nodes}
        assert set(phases.values()) == {"Ready"}, f"phases {phases}"
        return True

    try:
        wait_for(ready, timeout=45, what="nodes Ready")
    except AssertionError as e:
        raise AssertionError(f"{e}\nthe operator's log (its end):\n{op.log()}") from None


def node_events(kube: client.ApiClient, node: str, reason: str) -> list[client.CoreV1Event]:
    found = client.CoreV1Api(kube).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason={reason}"
    )
    return list(found.items)


def test_a_wall_clock_step_forward_expires_no_node_whose_agent_renews(
    fleet: Fleet, stepped: tuple[SteppedClock, OperatorProcess], kube: client.ApiClient
) -> None:
    clock, op = stepped
    nodes = [fleet.node(f"n{i}") for i in range(3)]
    for i, node in enumerate(nodes):
        renewing(fleet, node)
        fleet.sandbox(f"sb{i}", node, "Running")
    wait_ready(fleet, op, nodes)
    before = op.metric(RECONCILES)
    clock.step(STEP)
    end = time.monotonic() + LEASE + GRACE + 4
    while time.monotonic() < end:
        phases = {n: node_phase(fleet, n) for n in nodes}
        assert set(phases.values()) == {"Ready"}, f"a renewing node left Ready: {phases}"
        time.sleep(0.2)
    assert op.metric(RECONCILES) > before + len(nodes), "no node passes ran after the step"
    assert [fleet.phase(f"sb{i}") for i in range(3)] == ["Running"] * 3
    for node in nodes:
        assert not node_events(kube, node, "NodeNotReady"), f"{node} was judged NotReady"
        assert not fleet.health(node).get("unhealthySince")
    assert op.proc.poll() is None, f"the operator died:\n{op.log()}"


def test_a_wall_clock_step_back_keeps_a_dead_nodes_deadline_on_the_monotonic_clock(
    fleet: Fleet, stepped: tuple[SteppedClock, OperatorProcess]
) -> None:
    clock, op = stepped
    dead, alive, other = (fleet.node(n) for n in ("dead", "alive", "other"))
    lost = renewing(fleet, dead)
    renewing(fleet, alive)
    renewing(fleet, other)
    fleet.sandbox("lost", dead, "Running")
    fleet.sandbox("kept", alive, "Running")
    wait_ready(fleet, op, [dead, alive, other])
    lost.pause()  # the agent dies; the operator saw its last renewal before the step
    stopped = time.monotonic()
    stopped_wall = datetime.now(UTC)
    stepped_at = clock.step(-STEP)
    assert stepped_at - stopped < LEASE - 1, "the step came too late to fall within the lease"
    wait_for(
        lambda: fleet.phase("lost") == "Dead",
        timeout=LEASE + GRACE + 15,
        what="the dead node's sandbox Dead after lease + grace (monotonic)",
        interval=0.1,
    )
    took = time.monotonic() - stopped
    # The last renewal the operator observed was at most one renewal before the pause.
    assert took >= LEASE + GRACE - RENEW_EVERY - 0.5, f"marked Dead {took:.1f}s after it stopped"
    assert fleet.phase("kept") == "Running"
    assert node_phase(fleet, alive) == "Ready"
    # Status speaks the operator's wall clock, ten minutes behind the real one.
    since = parse_time(fleet.health(dead)["unhealthySince"])
    assert since is not None
    expected = stopped_wall - timedelta(seconds=STEP) + timedelta(seconds=LEASE)
    assert abs((since - expected).total_seconds()) < RENEW_EVERY + 1.5, (since, expected)
    assert op.proc.poll() is None, f"the operator died:\n{op.log()}"
