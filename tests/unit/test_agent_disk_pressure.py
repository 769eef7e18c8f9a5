"""The node's disk-pressure pass at the agent's own boundary (an in-memory
``Runtime`` and API): image GC first, then evictions in rank order, the evicted
sandbox ``Failed``/``Evicted`` naming both usages, a collection before choosing
and after each, and nobody more chosen while an eviction is in flight or for bytes
an exited sandbox's teardown gives back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sandlot.adapters.runtime import RuntimeTimeout, TaskState
from sandlot.agent.diskpressure import DiskPressure
from sandlot.api.reasons import SandboxReason
from sandlot.policy.imagegc import DiskUsage
from tests.unit.test_agent_ephemeral_storage import MI, World


class Disk:
    """The node's filesystem as the pass reads it; image GC frees ``gc_frees``."""

    def __init__(self, used: int, total: int = 1000 * MI, gc_frees: int = 0) -> None:
        self.used, self.total, self.gc_frees = used, total, gc_frees
        self.gc_runs = 0

    def usages(self) -> list[DiskUsage]:
        return [DiskUsage(total_bytes=self.total, used_bytes=self.used)]

    def collect(self) -> None:
        self.gc_runs += 1
        self.used -= self.gc_frees


def pressure(world: World, disk: Disk) -> DiskPressure:
    return DiskPressure(world.guard, disk.usages, 0.5, 0.4, disk.collect)


def test_under_the_high_watermark_nothing_runs(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.sandbox("w", limit=None, wrote=2 * MI)
    disk = Disk(used=499 * MI)
    assert not pressure(world, disk).pass_once().pressure
    assert disk.gc_runs == 0 and world.work.torn_down == []


def test_image_gc_goes_first_and_may_be_enough(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.sandbox("w", limit=None, wrote=2 * MI)
    disk = Disk(used=600 * MI, gc_frees=300 * MI)
    assert not pressure(world, disk).pass_once().pressure
    assert disk.gc_runs == 1 and world.work.torn_down == []


def test_the_largest_writer_is_evicted_and_the_quiet_one_keeps_running(tmp_path: Path) -> None:
    world = World(tmp_path)
    big = world.sandbox("big", limit=None, wrote=3 * MI)
    small = world.sandbox("small", limit=None, wrote=2 * MI)
    quiet = world.sandbox("quiet", limit=64 * MI, wrote=4096)
    # 51% of 10 MiB: down to 40% is 1.1 MiB, which the largest alone frees
    disk = Disk(used=int(10 * MI * 0.51), total=10 * MI)
    collections: list[str] = []

    def collect_garbage(*, timeout: float) -> None:
        collections.append(f"after {len(world.work.torn_down)} teardown(s)")

    world.rt.collect_garbage = collect_garbage  # type: ignore[method-assign]
    decision = pressure(world, disk).pass_once()
    assert decision.pressure and [e.key for e in decision.evict] == ["ns/big"]
    status = world.status("big")
    assert (status["phase"], status["reason"]) == ("Failed", SandboxReason.EVICTED), status
    assert "ephemeral-storage" in status["message"] and "51% full" in status["message"]
    assert "this sandbox used 3.0Mi" in status["message"], status["message"]
    assert world.work.torn_down == [big]
    # one before choosing (what nothing references goes first), one after the
    # teardown: its snapshot's files go only then
    assert collections == ["after 0 teardown(s)", "after 1 teardown(s)"]
    for name, cid in (("small", small), ("quiet", quiet)):
        assert world.status(name)["phase"] == "Running" and cid in world.rt.containers


def test_an_exited_sandboxs_layer_counts_as_freed_and_no_quiet_neighbour_pays_for_it(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    # a teardown that did not finish (its task killed, the container kept for the
    # sweep): its 4 MiB go when the sweep removes it
    left = world.sandbox("left", limit=None, wrote=4 * MI, state=TaskState.STOPPED)
    big = world.sandbox("big", limit=None, wrote=3 * MI)
    quiet = world.sandbox("quiet", limit=None, wrote=4096)
    # 90% of 10 MiB: 5 MiB to free down to 40%; the live sandboxes hold 3 MiB and
    # 4 KiB, so without the 4 MiB on their way out both would be chosen
    decision = pressure(world, Disk(used=9 * MI, total=10 * MI)).pass_once()
    assert decision.pressure and [e.key for e in decision.evict] == ["ns/big"], decision
    assert world.work.torn_down == [big]
    assert world.status("quiet")["phase"] == "Running" and quiet in world.rt.containers
    assert left in world.rt.containers  # the sweep's, not the pass's


def test_a_collection_that_frees_enough_leaves_every_sandbox_running(tmp_path: Path) -> None:
    world = World(tmp_path)
    big = world.sandbox("big", limit=None, wrote=3 * MI)
    disk = Disk(used=9 * MI, total=10 * MI)

    def collect_garbage(*, timeout: float) -> None:
        disk.used = 3 * MI  # a container the sweep removed: its snapshot's files go now

    world.rt.collect_garbage = collect_garbage  # type: ignore[method-assign]
    decision = pressure(world, disk).pass_once()
    assert decision.evict == () and not decision.to_free, decision
    assert world.work.torn_down == [] and big in world.rt.containers
    assert world.status("big")["phase"] == "Running"


def test_while_a_writers_layer_is_unnamed_nobody_is_evicted_for_at_most_the_hold(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    big = world.sandbox("big", limit=None, wrote=3 * MI)
    quiet = world.sandbox("quiet", limit=None, wrote=4096)
    naming = world.rt.writable_layer

    def slow_for_big(container_id: str, *, timeout: float) -> str:
        if container_id == big:
            raise RuntimeTimeout(f"Snapshots.Mounts {container_id}: no answer within 2s")
        return naming(container_id, timeout=timeout)

    world.rt.writable_layer = slow_for_big  # type: ignore[method-assign]
    now = [100.0]
    guard = DiskPressure(
        world.guard, Disk(used=9 * MI, total=10 * MI).usages, 0.5, 0.4, lambda: None,
        clock=lambda: now[0],
    )  # fmt: skip
    # without big's figure the projection would choose the quiet one alone
    for t in (100.0, 102.0, 104.9):
        now[0] = t
        decision = guard.pass_once()
        assert decision.pressure and decision.evict == (), (t, decision)
    assert world.status("quiet")["phase"] == "Running" and quiet in world.rt.containers
    now[0] = 105.0  # the hold is over: the pass goes on with what it knows
    assert [e.key for e in guard.pass_once().evict] == ["ns/quiet"]


def test_nobody_more_is_chosen_while_an_eviction_is_in_flight(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.sandbox("big", limit=None, wrote=3 * MI)
    quiet = world.sandbox("quiet", limit=None, wrote=MI)
    guard = pressure(world, Disk(used=9 * MI, total=10 * MI))
    guard.evicting.add("ns/big")
    world.pool.busy_keys.add("ns/big")  # its teardown and collection still running
    decision = guard.pass_once()
    assert decision.pressure and decision.evict == ()
    assert world.status("quiet")["phase"] == "Running" and quiet in world.rt.containers


def test_new_sandboxes_are_refused_while_the_pressure_holds_and_the_sync_is_woken(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    disk = Disk(used=600 * MI)
    now = [1000.0]
    changes: list[float] = []
    guard = DiskPressure(
        world.guard,
        disk.usages,
        0.5,
        0.4,
        disk.collect,
        transition=300.0,
        on_change=lambda: changes.append(now[0]),
        clock=lambda: now[0],
    )
    assert guard.refusal() == ""
    guard.pass_once()
    why = guard.refusal()
    assert "under disk pressure" in why and "60% full" in why and "high watermark 50%" in why
    assert changes == [1000.0]
    disk.used = 100 * MI  # back under: held for the transition period
    now[0] += 299.0
    guard.pass_once()
    assert guard.refusal() and changes == [1000.0]
    now[0] += 1.0
    guard.pass_once()
    assert guard.refusal() == "" and changes == [1000.0, 1300.0]


def test_status_disk_is_written_on_each_transition_and_a_failed_write_retried(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    disk = Disk(used=100 * MI)
    now = [0.0]
    written: list[dict[str, object]] = []
    fail = [False]

    def publish(status: dict[str, object]) -> None:
        if fail[0]:
            raise RuntimeError("API server down")
        written.append(status)

    guard = DiskPressure(
        world.guard,
        disk.usages,
        0.5,
        0.4,
        disk.collect,
        transition=60.0,
        clock=lambda: now[0],
        publish=publish,
        wall=lambda: datetime(2026, 1, 1, 12, 0, int(now[0]), tzinfo=UTC),
    )
    guard.pass_once()
    assert written == []  # registration said "no pressure": nothing new to write
    disk.used = 600 * MI
    guard.pass_once()
    disk.used = 100 * MI
    now[0] = 30.0
    guard.pass_once()  # still within the transition period: no second write
    assert len(written) == 1, written
    on = written[0]
    assert on["pressure"] is True and on["since"] == "2026-01-01T12:00:00.000000Z", on
    assert on["usagePercent"] == 60.0 and on["usedBytes"] == 600 * MI, on
    assert "disk pressure" in str(on["message"]), on
    now[0], fail[0] = 61.0, True
    guard.pass_once()  # pressure over, but the write fails
    assert len(written) == 1
    fail[0] = False
    guard.pass_once()
    assert written[1:] == [{"pressure": False, "since": None, "message": ""}], written
