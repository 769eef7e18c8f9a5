"""Suspending sandboxes: the pure decisions of ``policy.suspension``, the sync rows
they add, the streams and capacity they change, and the committed image's documents."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from sandlot.adapters.containerd.commit import committed_documents
from sandlot.adapters.pulling import Pushed, RegistryError
from sandlot.adapters.runtime import ContainerInfo, ImageConfig, RuntimeError_, TaskState
from sandlot.agent.sandboxes import StartFailed
from sandlot.agent.status import StatusWriter
from sandlot.agent.suspend import Suspensions
from sandlot.agent.teardown import teardown
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.api.sandbox import OperatingMode, SandboxPhase
from sandlot.policy.agentsweep import ContainerView
from sandlot.policy.agentsync import Action, ActionKind, SandboxState, plan_sync
from sandlot.policy.capacity import Capacity
from sandlot.policy.conditions import parse_conditions
from sandlot.policy.operatingmode import mode_outcome, stream_refusal
from sandlot.policy.pulling import FailureKind
from sandlot.policy.startrefusals import StartFacts
from sandlot.policy.suspension import (
    SuspendStep,
    decide_suspension,
    is_suspended_image,
    live_uids,
    next_pull_retry,
    orphaned_images,
    pull_retry_due,
    restore_pull,
    suspended_condition,
    suspended_image_name,
)
from tests.support.agent import FakeRuntime
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

M = OperatingMode
S = SuspendStep
KEY, CID, NODE = "ns/box", "sb-uid-1", "node-a"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

# ---------------------------------------------------------------- decide_suspension

# (mode, recorded suspended, container present, refused for this spec) -> step
DECISIONS = {
    "suspend-a-running-container": (M.SUSPENDED, False, True, False, S.COMMIT),
    "suspend-refused-for-this-spec-waits": (M.SUSPENDED, False, True, True, S.NONE),
    "recorded-but-container-left-by-a-crash": (M.SUSPENDED, True, True, False, S.REMOVE),
    "suspended-and-gone-rests": (M.SUSPENDED, True, False, False, S.NONE),
    "asked-suspended-never-recorded-and-gone-is-not-ours": (M.SUSPENDED, False, False, False, None),
    "running-again-restores": (M.RUNNING, True, False, False, S.RESTORE),
    "paused-from-suspended-restores-first": (M.PAUSED, True, False, False, S.RESTORE),
    "restore-refused-for-this-spec-waits": (M.RUNNING, True, False, True, S.NONE),
    "restored-but-unsaid-records": (M.RUNNING, True, True, False, S.RECORD_RESTORED),
    "never-suspended-running-is-not-ours": (M.RUNNING, False, True, False, None),
    "never-suspended-paused-is-not-ours": (M.PAUSED, False, True, False, None),
}


@pytest.mark.parametrize(
    ("mode", "suspended", "has_container", "failed", "step"),
    DECISIONS.values(),
    ids=list(DECISIONS),
)
def test_decide_suspension(
    mode: OperatingMode, suspended: bool, has_container: bool, failed: bool, step: S | None
) -> None:
    assert decide_suspension(mode, suspended, has_container, failed) is step


# ---------------------------------------------------------------- bodies and state


def cond(status: str, reason: str, generation: int | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"type": "Suspended", "status": status, "reason": reason}
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def body(
    mode: str | None = None, conditions: list[dict[str, Any]] | None = None, generation: int = 3
) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": "busybox", "nodeName": NODE}
    if mode is not None:
        spec["operatingMode"] = mode
    return {
        "metadata": {"namespace": "ns", "name": "box", "uid": "uid-1", "generation": generation},
        "spec": spec,
        "status": {"phase": "Running", "containerId": CID, "conditions": conditions or []},
    }


STATES = {
    "asked-not-recorded": (body("Suspended"), False, False),
    "recorded": (body("Suspended", [cond("True", "Suspended", 3)]), True, False),
    "restored": (body("Running", [cond("False", "Restored", 4)]), False, False),
    "refused-at-this-generation": (
        body("Suspended", [cond("False", "SuspendFailed", 3)]),
        False,
        True,
    ),
    "refused-at-an-older-generation": (
        body("Suspended", [cond("False", "SuspendFailed", 2)]),
        False,
        False,
    ),
    "restore-refused-stays-recorded": (
        body("Running", [cond("True", "RestoreFailed", 3)]),
        True,
        True,
    ),
}


@pytest.mark.parametrize(("obj", "suspended", "failed"), STATES.values(), ids=list(STATES))
def test_sandbox_state_reads_the_suspended_condition(
    obj: dict[str, Any], suspended: bool, failed: bool
) -> None:
    state = SandboxState.from_object(obj)
    assert (state.suspended, state.suspend_failed) == (suspended, failed)


# ---------------------------------------------------------------- the sync's rows


def container() -> ContainerView:
    return ContainerView(CID, {SANDBOX_LABEL: KEY})


def sandbox(
    mode: OperatingMode, *, suspended: bool = False, failed: bool = False, pushed: bool = False
) -> SandboxState:
    return SandboxState(
        KEY,
        SandboxPhase.RUNNING,
        CID,
        mode=mode,
        suspended=suspended,
        suspend_failed=failed,
        pushed=pushed,
    )


# (sandbox, container present, node drained) -> actions
ROWS = {
    "asked-suspended-is-committed": (
        sandbox(M.SUSPENDED),
        True,
        False,
        [Action(ActionKind.SUSPEND, KEY, CID)],
    ),
    "recorded-with-its-container-left-removes-it": (
        sandbox(M.SUSPENDED, suspended=True),
        True,
        False,
        [Action(ActionKind.SUSPEND, KEY, CID)],
    ),
    "suspended-without-container-is-not-lost": (
        sandbox(M.SUSPENDED, suspended=True),
        False,
        False,
        [],
    ),
    "asked-suspended-not-recorded-without-container-is-lost": (
        sandbox(M.SUSPENDED),
        False,
        False,
        [Action(ActionKind.END_LOST, KEY)],
    ),
    "running-again-restores": (
        sandbox(M.RUNNING, suspended=True),
        False,
        False,
        [Action(ActionKind.RESTORE, KEY)],
    ),
    "restored-container-unsaid-is-recorded": (
        sandbox(M.RUNNING, suspended=True),
        True,
        False,
        [Action(ActionKind.RESTORE, KEY, CID)],
    ),
    "a-drained-node-ends-a-suspended-sandbox": (
        sandbox(M.RUNNING, suspended=True),
        False,
        True,
        [Action(ActionKind.END_DRAINED, KEY)],
    ),
    "a-drained-node-ends-one-asked-to-stay-suspended": (
        sandbox(M.SUSPENDED, suspended=True),
        False,
        True,
        [Action(ActionKind.END_DRAINED, KEY)],
    ),
    "a-drained-node-suspends-one-asked-to-suspend-its-work-kept": (
        sandbox(M.SUSPENDED),
        True,
        True,
        [Action(ActionKind.SUSPEND, KEY, CID)],
    ),
    "a-drained-node-stops-one-whose-suspend-was-refused": (
        sandbox(M.SUSPENDED, failed=True),
        True,
        True,
        [Action(ActionKind.STOP_DRAINED, KEY, CID)],
    ),
    "a-drained-node-removes-the-container-of-a-recorded-suspension": (
        sandbox(M.SUSPENDED, suspended=True, pushed=True),
        True,
        True,
        [Action(ActionKind.SUSPEND, KEY, CID)],
    ),
    "a-drained-node-leaves-a-pushed-state-to-be-moved": (
        sandbox(M.SUSPENDED, suspended=True, pushed=True),
        False,
        True,
        [],
    ),
    "a-drained-node-neither-ends-nor-restores-a-pushed-one-asked-to-run": (
        sandbox(M.RUNNING, suspended=True, pushed=True),
        False,
        True,
        [],
    ),
    "a-refused-suspend-is-not-tried-again": (sandbox(M.SUSPENDED, failed=True), True, False, []),
    "a-refused-restore-is-not-tried-again": (
        sandbox(M.RUNNING, suspended=True, failed=True),
        False,
        False,
        [],
    ),
}


@pytest.mark.parametrize(("sb", "present", "drained", "expected"), ROWS.values(), ids=list(ROWS))
def test_plan_sync_suspension_rows(
    sb: SandboxState, present: bool, drained: bool, expected: list[Action]
) -> None:
    containers = [container()] if present else []
    assert plan_sync([sb], containers, drained=drained, in_flight=()) == expected


def _waiting() -> dict[str, Any]:
    waiting = body()
    waiting["metadata"] = {**waiting["metadata"], "name": "next"}
    waiting["status"] = {"phase": "Scheduled"}
    waiting["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    return waiting


@pytest.mark.parametrize(
    ("mode", "recorded", "present", "fits"),
    [
        ("Suspended", True, False, True),
        ("Suspended", False, True, False),
        ("Paused", False, True, False),
        ("Running", True, True, False),
    ],
    ids=[
        "suspended-counts-nothing",
        "not-yet-suspended-counts",
        "paused-counts",
        "restored-counts",
    ],
)
def test_node_capacity_counts_nothing_of_a_suspended_sandbox(
    mode: str, recorded: bool, present: bool, fits: bool
) -> None:
    held = body(mode, [cond("True", "Suspended")] if recorded else [])
    held["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    waiting = _waiting()
    facts = StartFacts(NODE, Capacity(10, 2**30 + 1), {"ns/box": held, "ns/next": waiting})
    states = [SandboxState.from_object(held), SandboxState.from_object(waiting)]
    containers = [container()] if present else []
    plan = plan_sync(states, containers, drained=False, in_flight=(), facts=facts)
    kinds = {a.key: a.kind for a in plan}
    assert kinds["ns/next"] is (ActionKind.START if fits else ActionKind.FAIL), plan


@pytest.mark.parametrize(
    ("other_limit", "restored"),
    [("512Mi", True), ("1Gi", False)],
    ids=["room-left-restores", "full-node-waits-suspended"],
)
def test_a_restore_waits_for_room_on_its_node(other_limit: str, restored: bool) -> None:
    back = body("Running", [cond("True", "Suspended")])
    back["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    other = body("Running")
    other["metadata"] = {**other["metadata"], "name": "other", "uid": "uid-2"}
    other["status"]["containerId"] = "sb-uid-2"
    other["spec"]["resources"] = {"limits": {"memory": other_limit}}
    facts = StartFacts(NODE, Capacity(10, 2**30 + 2**29), {"ns/box": back, "ns/other": other})
    states = [SandboxState.from_object(back), SandboxState.from_object(other)]
    views = [ContainerView("sb-uid-2", {SANDBOX_LABEL: "ns/other"})]
    plan = plan_sync(states, views, drained=False, in_flight=(), facts=facts)
    if restored:
        assert plan == [Action(ActionKind.RESTORE, KEY)]
    else:
        assert [(a.kind, a.key) for a in plan] == [(ActionKind.WAIT_RESTORE, KEY)], plan
        assert f"node {NODE} is full" in plan[0].message and "memory" in plan[0].message


def test_a_restore_waiting_for_room_says_why_once() -> None:
    recorded = cond("True", "Suspended", 1) | {"message": "committed"}
    world = World("Running", container=False, conditions=[recorded])
    why = f"node {NODE} is full: its memory limit 1.0Gi does not fit"
    world.suspensions.wait_for_room(world.body(), why)
    c = world.condition()
    assert (c.status, c.reason) == ("True", "Suspended"), "still suspended"
    assert c.message == f"waiting for room to run again on node {world.work.node}: {why}"
    writes = list(world.objects.writes)
    assert writes, "nothing was written"
    world.suspensions.wait_for_room(world.body(), why)
    assert world.objects.writes == writes, "the same words were written again"
    assert not world.work.restarted


# ---------------------------------------------------------------- streams and waiters


REFUSALS = {
    "asked-suspended": (body("Suspended"), "is Suspended (spec.operatingMode)"),
    "recorded-suspended": (body("Suspended", [cond("True", "Suspended")]), "is Suspended"),
    "restoring": (body("Running", [cond("True", "Suspended")]), "still suspended (restoring)"),
    "restored": (body("Running", [cond("False", "Restored")]), None),
}


@pytest.mark.parametrize(("obj", "says"), REFUSALS.values(), ids=list(REFUSALS))
def test_stream_refusal_of_a_suspended_sandbox(obj: dict[str, Any], says: str | None) -> None:
    refusal = stream_refusal(obj, "exec")
    if says is None:
        assert refusal is None
    else:
        assert refusal is not None and says in refusal and "ns/box" in refusal


@pytest.mark.parametrize(
    ("obj", "mode", "outcome"),
    [
        (body("Suspended"), M.SUSPENDED, None),
        (body("Suspended", [cond("True", "Suspended")]), M.SUSPENDED, "applied"),
        (body("Running", [cond("True", "Suspended")]), M.RUNNING, None),
        (body("Running", [cond("False", "Restored")]), M.RUNNING, "applied"),
        (
            body("Suspended", [cond("False", "SuspendFailed", 3) | {"message": "why"}]),
            M.SUSPENDED,
            "why",
        ),
        (body("Running", [cond("True", "RestoreFailed", 3) | {"message": "no"}]), M.RUNNING, "no"),
    ],
    ids=["waits", "applied", "restore-waits", "restored", "suspend-refused", "restore-refused"],
)
def test_mode_outcome_of_suspend_and_restore(
    obj: dict[str, Any], mode: OperatingMode, outcome: str | None
) -> None:
    assert mode_outcome(obj, mode) == outcome


def test_conditions_say_what_was_done_and_where() -> None:
    done = suspended_condition(True, NODE, 3)
    assert (done.status, done.reason, done.observed_generation) == ("True", "Suspended", 3)
    assert NODE in done.message
    refused = suspended_condition(True, NODE, 3, "no diff")
    assert (refused.status, refused.reason) == ("False", "SuspendFailed")
    assert "no diff" in refused.message and "not tried again" in refused.message
    restored = suspended_condition(False, NODE, 4)
    assert (restored.status, restored.reason) == ("False", "Restored")
    failed = suspended_condition(False, NODE, 4, "gone")
    assert (failed.status, failed.reason) == ("True", "RestoreFailed")


def test_the_committed_image_is_named_after_the_sandbox_and_held() -> None:
    name = suspended_image_name("uid-1")
    assert "uid-1" in name and is_suspended_image(name)
    assert not is_suspended_image("docker.io/library/busybox:latest")


def test_orphaned_images_are_those_of_no_live_sandbox() -> None:
    ended = body("Suspended") | {"status": {"phase": "Stopped"}}
    ended["metadata"] = {**ended["metadata"], "uid": "uid-2"}
    live = live_uids([body("Suspended"), ended])
    assert live == {"uid-1"}
    names = [suspended_image_name("uid-1"), suspended_image_name("uid-2"), "busybox:latest"]
    assert orphaned_images(names, live) == [suspended_image_name("uid-2")]
    assert orphaned_images(names, None) == [], "unknown sandboxes orphan nothing"


# ---------------------------------------------------------------- the committed image


def test_committed_documents_append_the_layer_to_config_and_manifest() -> None:
    config: dict[str, Any] = {
        "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:a"]},
    }
    layers = [
        {
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": "sha256:g",
            "size": 9,
        }
    ]
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:b", "size": 4}
    config_bytes, manifest_bytes = committed_documents(
        config, layers, layer, datetime(2026, 1, 1, tzinfo=UTC)
    )
    new_config, manifest = json.loads(config_bytes), json.loads(manifest_bytes)
    assert new_config["rootfs"]["diff_ids"] == ["sha256:a", "sha256:b"]
    assert new_config["config"] == {"Cmd": ["sh"]}
    assert new_config["history"][-1]["created"] == "2026-01-01T00:00:00Z"
    assert config["rootfs"]["diff_ids"] == ["sha256:a"], "the image's own config was changed"
    assert [entry["digest"] for entry in manifest["layers"]] == ["sha256:g", "sha256:b"]
    assert manifest["config"]["size"] == len(config_bytes)


# ---------------------------------------------------------------- the agent's work


class Work:
    """What ``Suspensions`` uses of ``SandboxWork``: runtime, status, teardown, restart."""

    def __init__(self, rt: FakeRuntime, objects: FakeObjects, clock: FakeClock) -> None:
        self.rt, self.objects, self.node = rt, objects, NODE
        self.status = StatusWriter(objects, NODE, clock.now)  # type: ignore[arg-type]
        self.settings = SimpleNamespace(image_pull_deadline=timedelta(seconds=1))
        self.call_timeout = 0.2
        self.torn_down: list[str] = []
        self.restarted: list[str] = []
        self.refuse_restart: str | None = None

    def teardown(self, container: ContainerInfo) -> None:
        self.torn_down.append(container.id)
        teardown(self.rt, container, kill_wait=0.2, call_timeout=0.2)

    def restart_from(
        self, sb: dict[str, Any], image: str
    ) -> tuple[ContainerInfo, dict[str, Any]] | None:
        if self.refuse_restart is not None:
            raise StartFailed("ImageNotFound", self.refuse_restart)
        self.restarted.append(image)
        info = self.rt.add(CID, {SANDBOX_LABEL: KEY})
        return info, {"containerId": CID, "pid": self.rt.tasks[CID].pid, "ip": "10.0.0.9"}


class World:
    def __init__(
        self, mode: str, *, container: bool = True, conditions: list[Any] | None = None
    ) -> None:
        self.clock = FakeClock(T0)
        self.objects = FakeObjects(self.clock.now)
        self.rt = FakeRuntime()
        self.info = self.rt.add(CID, {SANDBOX_LABEL: KEY}) if container else None
        self.objects.add_sandbox("ns", "box", T0, node=NODE, phase="Running")
        stored = self.objects.sandboxes[KEY]
        stored["spec"]["operatingMode"] = mode
        stored["metadata"]["generation"] = 2
        stored["status"]["conditions"] = list(conditions or [])
        self.uid = stored["metadata"]["uid"]
        self.work = Work(self.rt, self.objects, self.clock)
        self.suspensions = Suspensions(self.work)  # type: ignore[arg-type]

    def body(self) -> dict[str, Any]:
        return self.objects.get_sandbox("ns", "box")

    def use_store(self, store: FakeStore | None) -> None:
        """The node's state repository is ``store`` (None: it has none), as the
        agent's parts wire it: suspensions push and pull there (never delete)."""
        self.suspensions.store = store  # type: ignore[assignment]

    def condition(self, kind: str = "Suspended") -> Any:
        found = parse_conditions(self.objects.sandboxes[KEY]["status"].get("conditions"))
        return next((c for c in found if c.type == kind), None)


def test_suspend_commits_records_and_only_then_removes_the_container() -> None:
    world = World("Suspended")
    assert world.info is not None
    assert world.suspensions.suspend(world.body(), world.info) is S.COMMIT
    calls = [method for method, _ in world.rt.calls]
    assert (
        calls.index("pause_task")
        < calls.index("commit_container")
        < calls.index("delete_container")
    )
    assert suspended_image_name(world.uid) in world.rt.images
    c = world.condition()
    assert (c.status, c.reason, c.observed_generation) == ("True", "Suspended", 2)
    assert world.work.torn_down == [CID] and CID not in world.rt.containers
    assert world.objects.sandboxes[KEY]["status"]["phase"] == "Running"


def test_a_refused_commit_is_recorded_and_the_task_runs_on() -> None:
    world = World("Suspended")
    assert world.info is not None

    def refuse(container_id: str, image: str, labels: Any, *, timeout: float) -> str:
        raise RuntimeError_("snapshot is a user namespace's copy", "unsupported")

    world.rt.commit_container = refuse  # type: ignore[method-assign]
    assert world.suspensions.suspend(world.body(), world.info) is None
    c = world.condition()
    assert (c.status, c.reason, c.observed_generation) == ("False", "SuspendFailed", 2)
    assert "user namespace" in c.message
    assert world.rt.tasks[CID].state is TaskState.RUNNING, "left frozen by a refused suspend"
    assert not world.work.torn_down
    state = SandboxState.from_object(world.body())
    assert plan_sync([state], [container()], drained=False, in_flight=()) == []


def test_a_silent_runtime_writes_nothing_and_keeps_the_container() -> None:
    world = World("Suspended")
    assert world.info is not None
    world.rt.wedged.add(CID)
    info = world.info
    outcome = world.rt.shim_clock.drive(
        lambda: world.suspensions.suspend(world.body(), info), busy=lambda finished: 1
    )
    assert outcome is None
    assert world.rt.shim_clock.now > 0, "the suspend did not wait out its deadline"
    assert world.condition() is None and not world.work.torn_down


def test_restore_starts_from_the_committed_image_and_says_so() -> None:
    paused = {"type": "Paused", "status": "True", "reason": "Paused", "message": "frozen"}
    recorded = cond("True", "Suspended", 1) | {"message": "committed"}
    world = World("Running", container=False, conditions=[recorded, paused])
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    assert world.work.restarted == [suspended_image_name(world.uid)]
    c = world.condition()
    assert (c.status, c.reason) == ("False", "Restored")
    assert world.condition("Paused").status == "False", "its frozen processes are gone"
    status = world.objects.sandboxes[KEY]["status"]
    assert (status["ip"], status["pid"]) == ("10.0.0.9", world.rt.tasks[CID].pid)


def test_a_refused_restore_is_recorded_and_not_tried_again() -> None:
    recorded = cond("True", "Suspended", 1) | {"message": "committed"}
    world = World("Running", container=False, conditions=[recorded])
    world.work.refuse_restart = "image gone"
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    c = world.condition()
    assert (c.status, c.reason, c.observed_generation) == ("True", "RestoreFailed", 2)
    state = SandboxState.from_object(world.body())
    assert plan_sync([state], [], drained=False, in_flight=()) == []


class FakeStore:
    """A state store that records pushes and pulls (or refuses them)."""

    def __init__(
        self, refuse: str | None = None, kind: FailureKind = FailureKind.TRANSIENT
    ) -> None:
        self.refuse, self.kind = refuse, kind
        self.pushed: list[tuple[str, str]] = []
        self.pulled: list[tuple[str, str]] = []
        self.owners: list[str] = []

    def push(self, owner: str, uid: str, image: str) -> Pushed:
        if self.refuse is not None:
            raise RegistryError(self.refuse, self.kind)
        assert owner == uid  # a sandbox's state is sealed under its own key
        self.pushed.append((uid, image))
        digest = "sha256:" + "1" * 64
        return Pushed(f"reg.example/state:{uid}@{digest}", digest, 2)

    def pull(self, reference: str, image: str, owner: str) -> None:
        if self.refuse is not None:
            raise RegistryError(self.refuse)
        self.pulled.append((reference, image))
        self.owners.append(owner)


def test_a_suspend_with_a_store_pushes_and_records_where() -> None:
    world = World("Suspended")
    assert world.info is not None
    store = FakeStore()
    world.use_store(store)
    assert world.suspensions.suspend(world.body(), world.info) is S.COMMIT
    assert store.pushed == [(world.uid, suspended_image_name(world.uid))]
    state = world.objects.sandboxes[KEY]["status"]["suspendedState"]
    assert state["node"] == NODE and state["image"].startswith(f"reg.example/state:{world.uid}@")
    c = world.condition()
    assert (c.status, c.reason) == ("True", "Suspended")
    assert "pushed to reg.example/state" in c.message
    assert SandboxState.from_object(world.body()).pushed


def test_a_refused_push_keeps_the_state_on_its_node_and_says_why() -> None:
    world = World("Suspended")
    assert world.info is not None
    world.use_store(FakeStore(refuse="HTTP 401 Unauthorized", kind=FailureKind.UNAUTHORIZED))
    assert world.suspensions.suspend(world.body(), world.info) is S.COMMIT
    assert "suspendedState" not in world.objects.sandboxes[KEY]["status"]
    c = world.condition()
    assert (c.status, c.reason) == ("True", "Suspended")
    assert "not pushed (HTTP 401 Unauthorized): it stays on this node" in c.message
    assert world.work.torn_down == [CID]  # suspended all the same, on this node


def moved_world(store: FakeStore | None) -> World:
    world = World("Running", container=False, conditions=[cond("True", "Suspended", 1)])
    world.objects.sandboxes[KEY]["status"]["suspendedState"] = {
        "image": "reg.example/state:u@sha256:" + "1" * 64,
        "digest": "sha256:" + "1" * 64,
        "node": "node-elsewhere",
    }
    world.use_store(store)
    return world


def test_a_state_pushed_from_another_node_is_pulled_then_started_and_cleared() -> None:
    store = FakeStore()
    world = moved_world(store)
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    image = suspended_image_name(world.uid)
    assert store.pulled == [("reg.example/state:u@sha256:" + "1" * 64, image)]
    assert world.work.restarted == [image]
    assert (world.condition().status, world.condition().reason) == ("False", "Restored")
    assert "suspendedState" not in world.objects.sandboxes[KEY]["status"]
    assert store.owners == [world.uid]  # opened with its own key


def test_a_state_this_node_has_no_repository_for_is_a_refused_restore() -> None:
    world = moved_world(None)
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    assert not world.work.restarted
    c = world.condition()
    assert (c.status, c.reason) == ("True", "RestoreFailed")
    assert "this node has no state repository" in c.message


def test_a_state_pull_that_fails_backs_off_and_is_tried_again_without_a_spec_change() -> None:
    store = FakeStore("stalled")
    world = moved_world(store)
    wakes: list[float] = []
    world.suspensions.wake_in = wakes.append
    assert world.suspensions.restore(world.body(), None) is None
    c = world.condition()
    assert (c.status, c.reason) == ("True", "RestorePullBackOff")
    assert "failed: stalled; tried again in 5s (failure 1)" in c.message
    assert wakes == [5.0] and not world.work.restarted

    world.clock.advance(4)  # not due: nothing tried, nothing written
    version = world.body()["metadata"]["resourceVersion"]
    assert world.suspensions.restore(world.body(), None) is None
    assert world.body()["metadata"]["resourceVersion"] == version and wakes == [5.0]

    world.clock.advance(1)  # due, and still failing: twice as long
    assert world.suspensions.restore(world.body(), None) is None
    assert "tried again in 10s (failure 2)" in world.condition().message and wakes[-1] == 10.0

    store.refuse = None  # the registry is back
    world.clock.advance(10)
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    assert world.work.restarted == [suspended_image_name(world.uid)]
    assert (world.condition().status, world.condition().reason) == ("False", "Restored")


@pytest.mark.parametrize(
    ("failures", "delay"), [(1, 5), (2, 10), (3, 20), (6, 160), (7, 300), (30, 300)]
)
def test_state_pull_retries_double_up_to_five_minutes(failures: int, delay: int) -> None:
    retry = None
    for _ in range(failures):
        retry = next_pull_retry(retry, T0)
    assert retry is not None and retry.failures == failures
    assert retry.not_before - T0 == timedelta(seconds=delay)
    assert not pull_retry_due(retry, T0 + timedelta(seconds=delay - 1))
    assert pull_retry_due(retry, T0 + timedelta(seconds=delay))


def test_a_state_pushed_from_this_node_starts_from_the_local_image() -> None:
    store = FakeStore()
    world = moved_world(store)
    world.objects.sandboxes[KEY]["status"]["suspendedState"]["node"] = NODE
    world.rt.images[suspended_image_name(world.uid)] = ImageConfig()  # still here
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    assert not store.pulled and world.work.restarted == [suspended_image_name(world.uid)]


def test_a_state_pushed_from_this_node_whose_local_copy_is_gone_is_pulled() -> None:
    """Moved away and back: the record names this node, but its image collector
    removed the committed image meanwhile; the restore pulls it instead of failing."""
    store = FakeStore()
    world = moved_world(store)
    world.objects.sandboxes[KEY]["status"]["suspendedState"]["node"] = NODE
    image = suspended_image_name(world.uid)
    assert image not in world.rt.images
    assert world.suspensions.restore(world.body(), None) is S.RESTORE
    assert store.pulled == [("reg.example/state:u@sha256:" + "1" * 64, image)]
    assert world.work.restarted == [image]
    assert (world.condition().status, world.condition().reason) == ("False", "Restored")


@pytest.mark.parametrize(
    ("state", "local", "pulled"),
    [
        ({}, False, None),
        ({}, True, None),
        ({"image": "r/s:u@sha256:1", "node": NODE}, True, None),
        ({"image": "r/s:u@sha256:1", "node": NODE}, False, "r/s:u@sha256:1"),
        ({"image": "r/s:u@sha256:1", "node": "elsewhere"}, True, "r/s:u@sha256:1"),
        ({"image": "r/s:u@sha256:1", "node": "elsewhere"}, False, "r/s:u@sha256:1"),
    ],
    ids=[
        "never-pushed-starts-local",
        "never-pushed-local-here",
        "pushed-here-and-still-here",
        "pushed-here-but-collected-meanwhile",
        "pushed-elsewhere-a-local-copy-is-older",
        "pushed-elsewhere-nothing-here",
    ],
)
def test_restore_pulls_whenever_this_nodes_store_lacks_that_commit(
    state: dict[str, Any], local: bool, pulled: str | None
) -> None:
    assert restore_pull(state, NODE, local) == pulled


def test_a_restore_a_crash_left_unsaid_is_recorded_and_its_pushed_state_cleared() -> None:
    world = moved_world(FakeStore())
    world.info = world.rt.add(CID, {SANDBOX_LABEL: KEY})
    assert world.suspensions.restore(world.body(), world.info) is S.RECORD_RESTORED
    status = world.objects.sandboxes[KEY]["status"]
    assert "suspendedState" not in status and status["pid"] == world.rt.tasks[CID].pid
    assert (world.condition().status, world.condition().reason) == ("False", "Restored")


SUSPENDED_RECORD = [cond("True", "Suspended", 2)]


def test_a_container_a_suspension_froze_and_left_is_thawed_and_taken_over() -> None:
    """The commit was recorded and the agent died before the container went; the
    spec asks for Running again: the frozen task is thawed, not left frozen."""
    world = World("Running", conditions=SUSPENDED_RECORD)
    assert world.info is not None
    world.rt.tasks[CID].state = TaskState.PAUSED
    assert world.suspensions.restore(world.body(), world.info) is S.RECORD_RESTORED
    assert world.rt.tasks[CID].state is TaskState.RUNNING
    assert (world.condition().status, world.condition().reason) == ("False", "Restored")


@pytest.mark.parametrize("task", [TaskState.STOPPED, None], ids=["killed", "no-task"])
def test_a_container_whose_process_a_suspension_ended_is_removed_not_taken_over(
    task: TaskState | None,
) -> None:
    """The removal killed the task and died before the container went: adopting it
    would record a Running sandbox with no process (which the reaper then ends).
    It is removed; the next pass restores from the committed image."""
    world = World("Running", conditions=SUSPENDED_RECORD)
    assert world.info is not None
    if task is None:
        del world.rt.tasks[CID]
    else:
        world.rt.tasks[CID].state = task
    assert world.suspensions.restore(world.body(), world.info) is None
    assert CID not in world.rt.containers and world.work.torn_down == [CID]
    assert (world.condition().status, world.condition().reason) == ("True", "Suspended")
