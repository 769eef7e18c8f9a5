"""The SandboxSnapshot decisions: binding, holding, taking, placing forks, collecting."""

from __future__ import annotations

from typing import Any

from sandlot.api.keys import SNAPSHOT_FINALIZER
from sandlot.policy.snapshots import (
    ForkPlacement,
    ForkSource,
    SnapshotDecision,
    TakeStep,
    decide_snapshot,
    fork_image,
    fork_placement,
    orphaned_snapshot_images,
    referrers,
    snapshot_image_name,
    snapshot_image_uid,
    take_step,
)

IMAGE = "sandlot.local/snapshots/u1:latest"


def snap(
    *, phase: str | None = None, node: str | None = None, held: bool = True, **meta: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": "s",
            "namespace": "ns",
            "uid": "u1",
            "finalizers": [SNAPSHOT_FINALIZER] if held else [],
            **meta,
        },
        "spec": {"sandboxName": "src", **({"nodeName": node} if node else {})},
    }
    if phase is not None:
        body["status"] = {"phase": phase, **({"imageRef": IMAGE} if phase == "Ready" else {})}
    return body


def sandbox(
    name: str = "src", phase: str = "Running", node: str | None = "n1", ref: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": "busybox"}
    if node:
        spec["nodeName"] = node
    if ref:
        spec["snapshotRef"] = {"name": ref}
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def test_a_new_snapshot_is_held_and_bound_to_its_sandboxs_node() -> None:
    assert decide_snapshot(snap(held=False), sandbox(), []) == SnapshotDecision(
        add_finalizer=True, node="n1"
    )
    assert decide_snapshot(snap(), sandbox(), []) == SnapshotDecision(node="n1")
    # Placed, not started yet: bound already (its agent waits for the container).
    assert decide_snapshot(snap(), sandbox(phase="Scheduled"), []).node == "n1"


def test_a_snapshot_waits_for_an_unplaced_sandbox_and_fails_without_one() -> None:
    assert decide_snapshot(snap(), sandbox(phase="Pending", node=None), []) == SnapshotDecision()
    missing = decide_snapshot(snap(held=False), None, [])
    assert missing.add_finalizer and missing.fail == "sandbox src does not exist"
    ended = decide_snapshot(snap(), sandbox(phase="Stopped"), [])
    assert ended.fail is not None and "Stopped" in ended.fail and ended.node is None


def test_a_bound_or_final_snapshot_needs_nothing_more() -> None:
    assert decide_snapshot(snap(node="n1"), None, []) == SnapshotDecision()
    assert decide_snapshot(snap(phase="Failed"), None, []) == SnapshotDecision()


def test_a_deleted_snapshot_is_let_go_only_when_nothing_refers_to_it() -> None:
    deleting = snap(phase="Ready", node="n1", deletionTimestamp="2030-01-01T00:00:00Z")
    assert decide_snapshot(deleting, None, ["Sandbox/f"]) == SnapshotDecision()
    assert decide_snapshot(deleting, None, []) == SnapshotDecision(remove_finalizer=True)
    gone = snap(held=False, deletionTimestamp="2030-01-01T00:00:00Z")
    assert decide_snapshot(gone, None, []) == SnapshotDecision()


def test_referrers_are_live_forks_and_pool_templates() -> None:
    sandboxes = [
        sandbox("a", ref="s"),
        sandbox("b", ref="other"),
        sandbox("c", phase="Failed", ref="s"),  # ended: needs it no more
        sandbox("d", phase="Pending", node=None, ref="s"),
        sandbox("e"),
    ]
    pools = [
        {
            "metadata": {"name": "warm"},
            "spec": {"template": {"spec": {"snapshotRef": {"name": "s"}}}},
        },
        {"metadata": {"name": "cold"}, "spec": {"template": {"spec": {}}}},
    ]
    assert referrers("s", sandboxes, pools) == ["Sandbox/a", "Sandbox/d", "SandboxPool/warm"]
    assert referrers("s", [], []) == []


def test_the_agent_commits_copies_waits_or_fails() -> None:
    bound = snap(node="n1")
    assert take_step(bound, sandbox(), True, False) is TakeStep.COMMIT
    assert take_step(bound, sandbox(), False, True) is TakeStep.COPY
    assert take_step(bound, sandbox(phase="Scheduled"), False, False) is TakeStep.WAIT
    assert take_step(bound, None, False, False) is TakeStep.FAIL
    assert take_step(bound, sandbox(phase="Dead"), True, False) is TakeStep.FAIL
    assert take_step(snap(phase="Ready", node="n1"), sandbox(), True, False) is None
    deleting = snap(node="n1", deletionTimestamp="2030-01-01T00:00:00Z")
    assert take_step(deleting, sandbox(), True, False) is None


def test_a_fork_goes_to_its_ready_snapshots_node() -> None:
    assert fork_placement("s", snap(phase="Ready", node="n1")) == ForkPlacement(node="n1")
    waiting = fork_placement("s", snap(phase="Taking", node="n1"))
    assert waiting.node is None and waiting.wait == "snapshot s is Taking, not Ready"
    assert fork_placement("s", None).wait == "snapshot s does not exist"
    failed = snap(phase="Failed", node="n1")
    failed["status"]["message"] = "refused"
    assert fork_placement("s", failed).fail == "snapshot s failed: refused"


def test_a_fork_starts_from_the_image_only_on_the_snapshots_node() -> None:
    assert fork_image(snap(phase="Ready", node="n1"), "n1") == ForkSource(IMAGE)
    assert fork_image(snap(phase="Ready", node="n1"), "n2") is None
    assert fork_image(snap(phase="Taking", node="n1"), "n1") is None
    assert fork_image(None, "n1") is None


PUSHED = "reg.example/state:snapshot-u1@sha256:" + "2" * 64


def test_a_pushed_snapshot_forks_anywhere_pulled_first_off_its_node() -> None:
    pushed = snap(phase="Ready", node="n1")
    pushed["status"]["pushedImage"] = PUSHED
    assert fork_placement("s", pushed) == ForkPlacement(node="n1", anywhere=True)
    assert fork_image(pushed, "n1") == ForkSource(IMAGE)  # its own node has it
    assert fork_image(pushed, "n2") == ForkSource(IMAGE, PUSHED)
    pushed["status"]["phase"] = "Taking"
    assert fork_image(pushed, "n2") is None


def test_a_snapshot_image_is_orphaned_once_its_object_is_gone() -> None:
    assert snapshot_image_name("u1") == IMAGE and snapshot_image_uid(IMAGE) == "u1"
    assert snapshot_image_uid("docker.io/library/busybox:1") is None
    names = [IMAGE, snapshot_image_name("u2"), "docker.io/library/busybox:1"]
    assert orphaned_snapshot_images(names, {"u1"}) == [snapshot_image_name("u2")]
    assert orphaned_snapshot_images(names, None) == []  # not listed yet: nothing goes
