"""A stateful fault test of a node's sandbox lifecycle (``policy.lifecycle``).

Hypothesis drives the agent's own parts (the sync pass, pauses and resumes, the
idle loop's freeze and its thaw for use, idle and asked suspensions, restores, the
reaper, the log pass, the image collector's choice) against the in-memory runtime
and API at the project's boundary, and breaks them at random: a status write
answered 5xx or 409, a get that fails, a runtime call that times out after it
landed or before it acted, the agent dying before or after any runtime call (its
memory gone, a new agent started over the same runtime and API), the watch
lagging, the spec changing, a task exiting on its own, the node lost (the
sandbox marked Dead), a suspended sandbox moved to another node, streams opened
and left open, files written (one arriving while a commit reads the container's
files), uses waiting for an idle-suspended sandbox. After every step it checks
the invariants of SPEC section 8 a node can break (``policy.lifecycle.INVARIANTS``),
and after a fault-free pass on a current watch, the ones promised "after one pass".

``make test`` runs a fixed budget on a fixed seed; ``SANDLOT_LIFECYCLE_EXAMPLES``
sets the budget and a fresh seed for a long run (``make soak``).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.runtime import ContainerInfo, RuntimeTimeout, TaskState
from sandlot.agent.idle import IdlePauses
from sandlot.agent.logs import SandboxLogs
from sandlot.agent.logwriter import LogWriter
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.reaper import Reaper
from sandlot.agent.runtimes import ClassSurvey
from sandlot.agent.sandboxes import StartFailed, container_id_for
from sandlot.agent.status import StatusWriter
from sandlot.agent.sync import SandboxSync
from sandlot.agent.teardown import teardown
from sandlot.api.common import key_of
from sandlot.api.keys import SANDBOX_LABEL, SANDBOX_UID_LABEL
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.policy.capacity import Capacity
from sandlot.policy.lifecycle import INVARIANTS
from sandlot.policy.operatingmode import FROZEN, idle_paused, stream_refusal, wanted_mode
from sandlot.policy.sandboxlogs import LOG_SUFFIX, log_stem
from sandlot.policy.streamslots import (
    Admission,
    StreamSlots,
    admit,
    begin_suspension,
    end_suspension,
    release,
)
from sandlot.policy.suspension import (
    live_uids,
    orphaned_images,
    recorded_suspended,
    suspended_image_name,
)
from tests.support.agent import FakeRuntime
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

NODE = "node-a"
NAMES = ("a", "b")
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CALL = 0.05
EXAMPLES = int(os.environ.get("SANDLOT_LIFECYCLE_EXAMPLES", "250"))
MUTATING = (
    "pause_task",
    "resume_task",
    "commit_container",
    "kill_task",
    "delete_task",
    "delete_container",
)


Fault = tuple[str, str, str] | None
API_FAULTS = st.tuples(
    st.just("api"), st.sampled_from(["patch-status", "get"]), st.sampled_from(["500", "409"])
)
RUNTIME_FAULTS = st.tuples(
    st.just("runtime"),
    st.sampled_from(MUTATING),
    st.sampled_from(["landed", "lost", "crash-before", "crash-after"]),
)
RARE = st.integers(0, 3)
"""An end (an exit, a lost node) acts on one draw in four: ended sandboxes do nothing."""
FAULTS = st.one_of(st.none(), API_FAULTS, RUNTIME_FAULTS)
"""The fault injected into one step of the agent's: none, the API's or the runtime's."""


class Crash(BaseException):
    """The agent's process dies here: nothing of it runs on (not an ``Exception``,
    so no handler of the agent's catches it)."""


class FaultyRuntime:
    """The in-memory runtime, whose next call of a method can be made to time out
    after it acted or before it acted, or to kill the agent before or after."""

    def __init__(self, rt: FakeRuntime) -> None:
        self.rt = rt
        self.faults: dict[str, str] = {}  # method -> "landed" | "lost" | "crash-before" | ...
        # Each container's files and each committed image's (what a commit read).
        self.files: dict[str, dict[str, int]] = {}
        self.image_files: dict[str, dict[str, int]] = {}
        # Called once a commit has read the files: a write that lands then.
        self.after_commit_read: Callable[[str], None] = lambda _cid: None

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.rt, name)
        if name not in MUTATING:
            return call

        def faulty(*args: Any, **kwargs: Any) -> Any:
            fault = self.faults.pop(name, None)
            if fault == "crash-before":
                raise Crash(f"the agent died before {name}")
            if fault == "lost":
                raise RuntimeTimeout(f"{name}: no answer (and it did nothing)")
            result = call(*args, **kwargs)
            if name == "commit_container":
                cid, image = args[0], args[1]
                self.image_files[image] = dict(self.files.get(cid, {}))
                self.after_commit_read(cid)
            if fault == "crash-after":
                raise Crash(f"the agent died after {name} landed")
            if fault == "landed":
                raise RuntimeTimeout(f"{name}: no answer (but it landed)")
            return result

        return faulty


class Watch:
    """The agent's watched view of the Sandboxes: as of its last catch-up."""

    def __init__(self, objects: FakeObjects) -> None:
        self.objects = objects
        self.synced = SimpleNamespace(is_set=lambda: True)
        self.view: dict[str, dict[str, Any]] = {}
        self.catch_up()

    def catch_up(self) -> None:
        """The node's Sandboxes now (its watch selects ``spec.nodeName``)."""
        self.view = {
            k: copy.deepcopy(b)
            for k, b in self.objects.sandboxes.items()
            if b["spec"].get("nodeName") == NODE
        }

    def items(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(b) for b in self.view.values()]

    def get(self, key: str) -> dict[str, Any] | None:
        found = self.view.get(key)
        return copy.deepcopy(found) if found is not None else None


class InlinePool:
    """``SandboxPools`` run in place: a job runs on the caller's thread, so a fault
    lands exactly where the machine puts it."""

    def __init__(self) -> None:
        self.busy_keys: set[str] = set()
        self.ended: Callable[[str], object] = lambda _key: None

    def in_flight(self) -> frozenset[str]:
        return frozenset(self.busy_keys)

    def busy(self, key: str) -> bool:
        return key in self.busy_keys

    def tell_ended(self, ended: Callable[[str], object]) -> None:
        self.ended = ended

    def wake_in(self, seconds: float) -> None:
        return None

    def submit(self, key: str, work: Callable[[], object], *, graceful: bool = False) -> bool:
        with self.holding(key) as held:
            if held:
                with suppress(Exception):  # as the pool's thread: logged, the key let go
                    work()
            return held

    @contextmanager
    def holding(self, key: str) -> Iterator[bool]:
        if key in self.busy_keys:
            yield False
            return
        self.busy_keys.add(key)
        try:
            yield True
        finally:
            self.busy_keys.discard(key)


class Streams:
    """The stream server's slots (``policy.streamslots``, the state the agent's
    server keeps under its lock): what a suspension asks of it, and admissions."""

    def __init__(self) -> None:
        self.slots = StreamSlots(limit=4)
        self.next = 0

    def in_use(self) -> frozenset[str]:
        return self.slots.in_use()

    @contextmanager
    def suspending(self, key: str) -> Iterator[bool]:
        self.slots, begun = begin_suspension(self.slots, key)
        try:
            yield begun
        finally:
            if begun:
                self.slots = end_suspension(self.slots, key)

    def open(self, key: str) -> int | None:
        """A connection's slot for ``key``; None when refused."""
        self.next += 1
        self.slots, answer = admit(self.slots, self.next, key)
        return self.next if answer is Admission.ADMITTED else None

    def close(self, connection: int) -> None:
        self.slots, _ = release(self.slots, connection)


class Work:
    """What the sync, the suspensions and the reaper use of ``SandboxWork`` for
    sandboxes already started: teardown, the restore's start, the ends."""

    def __init__(self, rt: FaultyRuntime, objects: FakeObjects, status: StatusWriter) -> None:
        self.rt, self.objects, self.status, self.node = rt, objects, status, NODE
        self.call_timeout = CALL
        self.settings = SimpleNamespace(
            image_pull_deadline=timedelta(seconds=1),
            suspend_state_repository="",
            default_memory_limit="",
            default_cpu_limit="",
            default_ephemeral_storage_limit="",
            cgroup_parent="sandlot",
        )
        self.facts = SimpleNamespace(capacity=Capacity(100))
        self.runtime_classes = SimpleNamespace(survey=lambda _live, _starting: ClassSurvey())
        self.rules = SimpleNamespace(defaults_of=lambda _bodies: {})
        self.started: list[str] = []  # the sandboxes started again here, in order

    def teardown(self, container: ContainerInfo | str) -> Any:
        return teardown(self.rt, container, kill_wait=CALL, call_timeout=CALL)

    def restart_from(self, sb: Mapping[str, Any], image: str) -> tuple[ContainerInfo, Any]:
        if image not in self.rt.rt.images:
            raise StartFailed("ImageNotFound", f"image {image} not found")
        self.started.append(key_of(sb))
        uid = sb["metadata"]["uid"]
        info = self.rt.rt.add(
            container_id_for(uid), {SANDBOX_LABEL: key_of(sb), SANDBOX_UID_LABEL: uid}
        )
        self.rt.files[info.id] = dict(self.rt.image_files.get(image, {}))
        return info, {"containerId": info.id, "pid": self.rt.rt.tasks[info.id].pid}

    def read_again(self, key: str, container: ContainerInfo) -> dict[str, Any] | None:
        try:
            return self.objects.get_sandbox(*key.split("/", 1))
        except ApiException as exc:
            if exc.status == 404:
                self.stop_deleted(key, container)
            return None

    def stop_deleted(self, key: str, container: ContainerInfo) -> None:
        self.teardown(container)

    def stop_ended(self, sb: Mapping[str, Any], container: ContainerInfo) -> None:
        self.teardown(container)

    def end_lost(self, key: str) -> None:
        try:
            obj = self.objects.get_sandbox(*key.split("/", 1))
        except ApiException:
            return
        if not recorded_suspended(obj):
            self.status.end(obj, SandboxPhase.STOPPED, "ContainerLost", "container gone")


class Agent:
    """One agent process over the node's runtime and the API: all its memory."""

    def __init__(
        self, rt: FaultyRuntime, objects: FakeObjects, clock: FakeClock, directory: Path
    ) -> None:
        self.watch = Watch(objects)
        self.pool = InlinePool()
        self.status = StatusWriter(objects, NODE, clock.now)  # type: ignore[arg-type]
        self.metrics = AgentMetrics(CollectorRegistry())
        self.work = Work(rt, objects, self.status)
        self.streams = Streams()
        node_watch = SimpleNamespace(synced=self.watch.synced, get=lambda _name: None)
        self.sync = SandboxSync(
            NODE,
            self.watch,  # type: ignore[arg-type]
            node_watch,  # type: ignore[arg-type]
            rt,
            self.pool,  # type: ignore[arg-type]
            self.work,  # type: ignore[arg-type]
            self.metrics,
            CALL,
        )
        self.idle = IdlePauses(
            rt,
            NODE,
            self.status,
            self.watch.items,
            self.metrics,
            lambda *_event: None,
            clock=clock.now,
            threshold_cores=0.01,
            cgroup_root="/nonexistent",
            cgroup_parent="sandlot",
            call_timeout=CALL,
            slots=self.pool,  # type: ignore[arg-type]
            sandbox_of=self.watch.get,
        )
        self.sync.modes.thaws = self.idle._lock
        self.sync.in_use = self.streams.in_use
        self.sync.suspensions.streams = self.streams
        self.sync.idle_flags = self.idle.suspends.flags
        self.sync.suspensions.idle = self.idle
        self.logs = SandboxLogs(
            LogWriter(directory / "logs", directory / "fifos", 1 << 20),
            rt,
            CALL,
            NODE,
            self.watch,  # type: ignore[arg-type]
            passes=lambda: None,
        )
        self.reaper = Reaper(
            objects,  # type: ignore[arg-type]
            rt,
            self.pool,  # type: ignore[arg-type]
            self.work,  # type: ignore[arg-type]
            self.status,
            self.metrics,
            cgroup_root="/nonexistent",
            call_timeout=CALL,
        )


NAMES_KEYS = tuple(f"ns/{name}" for name in NAMES)


def _index(i: int) -> str:
    return f"ns/{NAMES[i]}"


class NodeLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(T0)
        self.objects = FakeObjects(self.clock.now)
        self.dir = Path(tempfile.mkdtemp(prefix="lifecycle-"))
        self.logs = self.dir / "logs"
        self.logs.mkdir()
        (self.dir / "fifos").mkdir()
        self.fake = FakeRuntime()
        self.rt = FaultyRuntime(self.fake)
        self.ended_on_purpose: set[str] = set()  # keys the machine ended (exit, node lost)
        self.moved: set[str] = set()  # keys moved to another node
        self.acknowledged: dict[str, dict[str, int]] = {}  # key -> path -> content
        self.writes = 0
        self.open_streams: list[int] = []
        self.rt.after_commit_read = self.write_during_commit
        self.write_mid_commit = False
        self.suspended_before: set[str] = set()
        for name in NAMES:
            self.objects.add_sandbox("ns", name, T0, node=NODE, phase="Running")
            body = self.objects.sandboxes[f"ns/{name}"]
            body["metadata"]["generation"] = 1
            body["spec"].update({"image": "img", "idleTimeoutSeconds": 30})
            uid = body["metadata"]["uid"]
            cid = container_id_for(uid)
            self.fake.add(cid, {SANDBOX_LABEL: f"ns/{name}", SANDBOX_UID_LABEL: uid})
            (self.logs / f"{log_stem('ns', name, uid)}{LOG_SUFFIX}").write_text("hello\n")
            body["status"].update({"containerId": cid, "pid": self.fake.tasks[cid].pid})
        self.agent = Agent(self.rt, self.objects, self.clock, self.dir)

    # ------------------------------------------------------------ helpers

    def body(self, key: str) -> dict[str, Any] | None:
        return self.objects.sandboxes.get(key)

    def restart(self) -> None:
        """A new agent process: its streams' connections died with the old one."""
        self.agent = Agent(self.rt, self.objects, self.clock, self.dir)
        self.open_streams.clear()

    def container_of(self, key: str) -> str | None:
        return next(
            (c.id for c in self.fake.containers.values() if c.labels.get(SANDBOX_LABEL) == key),
            None,
        )

    def started_after_move(self) -> list[str]:
        return [k for k in self.agent.work.started if k in self.moved]

    def run(self, step: Callable[[], object], fault: Fault = None) -> None:
        """Run one of the agent's steps with ``fault`` injected into it; a crash ends
        the agent and a new one starts; a fault the step did not reach is dropped."""
        before = {k for k, b in self.objects.sandboxes.items() if recorded_suspended(b)}
        if fault is not None and fault[0] == "api":
            _, verb, status = fault
            self.objects.fail_next(verb, ApiException(status=int(status), reason="injected"))
        elif fault is not None:
            self.rt.faults[fault[1]] = fault[2]
        try:
            step()
        except Crash:
            self.restart()
        finally:
            self.objects.faults.clear()
            self.rt.faults.clear()
        self.suspended_before |= before
        self.clock.advance(1.0)

    # ------------------------------------------------------------ the world

    @rule(i=st.integers(0, 1), mode=st.sampled_from(["Running", "Paused", "Suspended"]))
    def set_mode(self, i: int, mode: str) -> None:
        body = self.body(_index(i))
        if body is None or wanted_mode(body) == mode:
            return
        body["spec"]["operatingMode"] = mode
        body["metadata"]["generation"] += 1
        self.objects.touch(body)

    @rule()
    def watch_catches_up(self) -> None:
        self.agent.watch.catch_up()

    @rule(i=st.integers(0, 1), rare=RARE)
    def task_exits(self, i: int, rare: int) -> None:
        if rare:
            return
        key = _index(i)
        cid = self.container_of(key)
        task = self.fake.tasks.get(cid or "")
        if task is not None and task.state is TaskState.RUNNING:
            task.state, task.exit_code = TaskState.STOPPED, 0
            self.ended_on_purpose.add(key)

    @rule(i=st.integers(0, 1), rare=RARE)
    def node_lost(self, i: int, rare: int) -> None:
        """The operator marks it Dead (its node was judged lost and came back)."""
        body = self.body(_index(i))
        if rare:
            return
        if body is not None and body["status"]["phase"] not in TERMINAL_PHASES:
            body["status"]["phase"] = SandboxPhase.DEAD
            self.objects.touch(body)
            self.ended_on_purpose.add(_index(i))

    def write_file(self, key: str) -> bool:
        """A files write into ``key`` as the stream server serves it: admitted on the
        agent's view (not refused for its mode, a slot taken), written into the running
        container, acknowledged, the slot given back. Whether it was acknowledged."""
        sb = self.agent.watch.get(key)
        cid = self.container_of(key)
        task = self.fake.tasks.get(cid or "")
        if sb is None or stream_refusal(sb, "files") or task is None:
            return False
        if task.state is not TaskState.RUNNING or cid is None:
            return False
        connection = self.agent.streams.open(key)
        if connection is None:
            return False
        try:
            self.writes += 1
            path = f"/data/{self.writes}"
            self.rt.files.setdefault(cid, {})[path] = self.writes
            self.acknowledged.setdefault(key, {})[path] = self.writes
        finally:
            self.agent.streams.close(connection)
        return True

    def write_during_commit(self, cid: str) -> None:
        """A user's write arriving while a commit reads the container's files."""
        key = next(k for k in NAMES_KEYS if self.container_of(k) == cid)
        if self.write_mid_commit:
            self.write_file(key)

    # ------------------------------------------------------------ the agent

    @rule(fault=FAULTS)
    def log_pass(self, fault: Fault) -> None:
        self.run(self.agent.logs.pass_once, fault)

    @rule(i=st.integers(0, 1), rare=RARE)
    def moved_away(self, i: int, rare: int) -> None:
        """The scheduler moves a suspended sandbox's state to another node (its node
        drained or lost): from then on it is that node's; this one keeps nothing of it."""
        body = self.body(_index(i))
        if rare or body is None or not recorded_suspended(body):
            return
        body["spec"]["nodeName"] = "node-b"
        self.objects.touch(body)
        self.moved.add(_index(i))
        self.agent.work.started.clear()  # what counts is a start after the move

    @rule(i=st.integers(0, 1))
    def files_write(self, i: int) -> None:
        self.write_file(_index(i))

    @rule(i=st.integers(0, 1))
    def stream_stays_open(self, i: int) -> None:
        """An exec session opens and stays (until ``streams_close``)."""
        sb = self.agent.watch.get(_index(i))
        if sb is not None and stream_refusal(sb, "exec") is None:
            connection = self.agent.streams.open(_index(i))
            if connection is not None:
                self.open_streams.append(connection)

    @rule()
    def streams_close(self) -> None:
        for connection in self.open_streams:
            self.agent.streams.close(connection)
        self.open_streams.clear()

    @rule(on=st.booleans())
    def writes_race_commits(self, on: bool) -> None:
        """From now on (or no longer) a write arrives while each commit reads."""
        self.write_mid_commit = on

    @rule(fault=FAULTS)
    def sync_pass(self, fault: Fault) -> None:
        self.run(self.agent.sync.sync_once, fault)

    @rule(fault=FAULTS)
    def reaper_pass(self, fault: Fault) -> None:
        self.run(self.agent.reaper.reap_once, fault)

    @rule(i=st.integers(0, 1), fault=FAULTS)
    def idle_freeze(self, i: int, fault: Fault) -> None:
        """The idle loop found it quiet past its timeout."""
        sb = self.agent.watch.get(_index(i))
        cid = (sb or {}).get("status", {}).get("containerId")
        if sb is None or not cid or idle_paused(sb) or recorded_suspended(sb):
            return
        self.run(lambda: self.agent.idle._freeze(sb, _index(i), cid, timedelta(seconds=30)), fault)

    @rule(i=st.integers(0, 1))
    def idle_suspension_due(self, i: int) -> None:
        """The idle loop found it quiet past its timeout (``idleAction: Suspend``)."""
        sb = self.agent.watch.get(_index(i))
        cid = (sb or {}).get("status", {}).get("containerId")
        if sb is not None and cid and not idle_paused(sb) and not recorded_suspended(sb):
            self.agent.idle.suspends.request(_index(i))

    @rule(i=st.integers(0, 1), waits=st.booleans())
    def a_use_waits(self, i: int, waits: bool) -> None:
        """An exec waits for an idle-suspended sandbox to run again (or stops waiting)."""
        suspends = self.agent.idle.suspends
        with suspends._lock:
            suspends._waking[_index(i)] = int(waits)

    @rule(i=st.integers(0, 1), fault=FAULTS)
    def stream_wakes(self, i: int, fault: Fault) -> None:
        """An exec arrives: the stream server thaws an idle-paused sandbox first."""
        sb = self.agent.watch.get(_index(i))
        if sb is not None and idle_paused(sb):
            self.run(lambda: self.agent.idle.wake(sb, "exec"), fault)

    @rule()
    def image_gc(self) -> None:
        """The collector removes committed images of no live sandbox (its choice)."""
        sandboxes = list(self.objects.sandboxes.values())
        for name in orphaned_images(list(self.fake.images), live_uids(sandboxes)):
            del self.fake.images[name]

    @rule(restart=st.booleans())
    def settle(self, restart: bool) -> None:
        """No fault, the watch current: one pass (after the one the watch's catch-up
        brings) keeps what the lifecycle promises, with or without a restart."""
        if restart:
            self.restart()
        event(f"settle: {sorted(t.state for t in self.fake.tasks.values())}")
        self.agent.watch.catch_up()
        self.run(self.agent.sync.sync_once)
        for key, body in self.objects.sandboxes.items():
            if key in self.moved:
                assert self.container_of(key) is None, f"{key} moved away; it runs here too"
                continue
            if body["status"]["phase"] in TERMINAL_PHASES:
                assert self.container_of(key) is None, f"{key} ended but its container runs"
                continue
            cid = self.container_of(key)
            task = self.fake.tasks.get(cid or "")
            if wanted_mode(body) == "Running" and task is not None and task.state in FROZEN:
                event("settled: frozen under a Running spec")
                assert idle_paused(body), (
                    f"{key}: spec Running, task frozen, nothing records why, after a pass"
                )

    # ------------------------------------------------------------ invariants

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @invariant()
    def no_work_slot_outlives_its_step(self) -> None:
        assert not self.agent.pool.busy_keys

    @invariant()
    def nothing_referenced_is_deleted(self) -> None:
        for key, body in self.objects.sandboxes.items():
            if body["status"]["phase"] in TERMINAL_PHASES or not recorded_suspended(body):
                continue
            if self.container_of(key) is None:
                image = suspended_image_name(body["metadata"]["uid"])
                assert image in self.fake.images, f"{key} is suspended but {image} is gone"

    @invariant()
    def the_reaper_never_ends_a_suspended_sandbox(self) -> None:
        for key in self.suspended_before - self.ended_on_purpose:
            body = self.body(key)
            if body is None:
                continue
            phase, reason = body["status"]["phase"], body["status"].get("reason")
            assert phase not in TERMINAL_PHASES, (
                f"{key} was suspended and ended {phase} ({reason}) without anyone asking"
            )

    @invariant()
    def an_acknowledged_write_is_in_whatever_the_sandbox_resumes_from(self) -> None:
        for key, written in self.acknowledged.items():
            body = self.body(key)
            if body is None or body["status"]["phase"] in TERMINAL_PHASES:
                continue
            cid = self.container_of(key)
            if cid is not None:
                files = self.rt.files.get(cid, {})
            elif recorded_suspended(body):
                files = self.rt.image_files.get(suspended_image_name(body["metadata"]["uid"]), {})
            else:
                continue
            lost = {p: v for p, v in written.items() if files.get(p) != v}
            assert not lost, f"{key}: acknowledged writes lost: {lost}"

    @invariant()
    def a_sandboxs_log_stays_while_it_exists_here(self) -> None:
        for key, body in self.objects.sandboxes.items():
            if key in self.moved or body["status"]["phase"] in TERMINAL_PHASES:
                continue
            meta = body["metadata"]
            name = f"{log_stem(meta['namespace'], meta['name'], meta['uid'])}{LOG_SUFFIX}"
            assert (self.logs / name).exists(), f"{key}: its log is gone while it exists"

    @invariant()
    def a_sandbox_moved_away_is_never_started_here(self) -> None:
        assert not self.started_after_move(), (
            f"restored here after its move to another node: {self.started_after_move()}"
        )

    @invariant()
    def a_sandbox_runs_in_one_container_at_most(self) -> None:
        keys = [c.labels.get(SANDBOX_LABEL) for c in self.fake.containers.values()]
        assert len(keys) == len(set(keys)), f"two containers for one sandbox: {keys}"


def test_the_invariants_are_the_lifecycle_tables() -> None:
    names = {i.name for i in INVARIANTS}
    assert {"thawed", "referenced", "kept-suspended", "one-node", "slots"} <= names


NodeLifecycle.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    derandomize=os.environ.get("SANDLOT_LIFECYCLE_EXAMPLES") is None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_node_lifecycle_under_faults = NodeLifecycle.TestCase


def test_a_pass_hands_its_actions_over_before_it_lists_the_tasks_and_thaws_after() -> None:
    """Listing the tasks asks every task's shim (about 140 ms at 100 tasks on a
    2-core node); only the lost-record rows need it, so nothing else waits for it:
    the deleted sandbox's container is already torn down when the listing runs,
    and the frozen, unrecorded task it finds is thawed in the same pass."""
    machine = NodeLifecycle()
    gone = machine.container_of("ns/b")
    frozen = machine.container_of("ns/a")
    assert gone is not None and frozen is not None
    del machine.objects.sandboxes["ns/b"]
    machine.agent.watch.catch_up()
    machine.fake.tasks[frozen].state = TaskState.PAUSED  # frozen, nothing records why
    present_when_listed: list[bool] = []
    listing = machine.fake.list_tasks

    def list_tasks(*, timeout: float) -> list[Any]:
        present_when_listed.append(gone in machine.fake.containers)
        return listing(timeout=timeout)

    machine.fake.list_tasks = list_tasks  # type: ignore[method-assign]
    machine.agent.sync.sync_once()
    assert present_when_listed == [False], "the tasks were listed before the teardown ran"
    assert machine.fake.tasks[frozen].state is TaskState.RUNNING


def test_a_pass_whose_task_listing_fails_still_runs_to_the_end() -> None:
    """The task listing serves only the lost-record rows: containerd not answering it
    (a wedged shim slows Tasks.List) costs those rows this pass, not the pass."""
    machine = NodeLifecycle()

    def silent(*, timeout: float) -> list[Any]:
        raise RuntimeTimeout(f"Tasks.List: no answer within {timeout:g}s")

    machine.fake.list_tasks = silent  # type: ignore[method-assign]
    cid = machine.container_of("ns/a")
    assert cid is not None
    machine.fake.tasks[cid].state = TaskState.PAUSED  # frozen, unrecorded: not seen now
    machine.agent.sync.sync_once()
    assert machine.agent.metrics.sync_passes._value.get() == 1
    assert machine.fake.tasks[cid].state is TaskState.PAUSED
