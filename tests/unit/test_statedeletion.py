"""Which pushed states may be deleted, given what still names their digest, and how
a failed delete is tried again: ``policy.statedeletion`` with plain data, and the
operator's pending list (``controllers.statedeletes``) over a store and the API's objects at
its own boundary."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.adapters.pulling import RegistryError
from sandlot.controllers.statedeletes import PASS_LIMIT, StateDeletes
from sandlot.policy.statedeletion import (
    MAX_ATTEMPTS,
    MAX_PENDING,
    Because,
    Pending,
    PushedState,
    Verdict,
    due_now,
    judge_deletion,
    judge_deletions,
    pushed_copy,
    pushed_state,
    queued,
    retry_after_failure,
)
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "1" * 64
REF = f"reg.example/sandlot/state:uid-1@{DIGEST}"
SHOT_REF = f"reg.example/sandlot/state:snapshot-s1@{DIGEST}"  # a second tag, one manifest
OTHER = "sha256:" + "2" * 64


def sandbox(
    uid: str = "uid-1",
    image: str | None = REF,
    *,
    name: str = "sb",
    phase: str = "Running",
    namespace: str = "ns",
) -> dict[str, Any]:
    digest = (image or "").rsplit("@", 1)[-1]
    state = {"image": image, "digest": digest, "node": "a"}
    status = {"phase": phase, **({"suspendedState": state} if image else {})}
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "status": status}


def snapshot(
    pushed: str | None = SHOT_REF,
    *,
    phase: str = "Ready",
    of: str = "sb",
    deleting: bool = False,
    namespace: str = "ns",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": "shot", "uid": "s1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    status: dict[str, Any] = {"phase": phase, **({"pushedImage": pushed} if pushed else {})}
    return {"metadata": meta, "spec": {"sandboxName": of}, "status": status}


def state(because: Because = Because.DELETED, ref: str = REF) -> PushedState:
    return PushedState(ref, "ns/sb", "uid-1", because)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (sandbox(), state()),
        (sandbox(image=None), None),
        (sandbox(image="reg.example/sandlot/state:uid-1"), None),  # no digest: nothing exact
        (None, None),
        ({"metadata": {"name": "sb"}, "status": sandbox()["status"]}, None),  # no uid
    ],
    ids=["pushed", "not-pushed", "tag-without-digest", "no-body", "no-uid"],
)
def test_pushed_state_is_read_from_the_last_body(
    obj: dict[str, Any] | None, expected: PushedState | None
) -> None:
    assert pushed_state(obj, Because.DELETED) == expected


@pytest.mark.parametrize(
    ("because", "sandboxes", "snapshots", "verdict", "holders"),
    [
        (Because.RESTORED, [sandbox(image=None)], [], Verdict.DELETE, ()),
        (Because.DELETED, [], [], Verdict.DELETE, ()),
        (Because.DELETED, [sandbox(uid="uid-2", image=None)], [], Verdict.DELETE, ()),
        (Because.DELETED, [sandbox()], [], Verdict.KEEP, ("Sandbox ns/sb",)),
        (Because.DELETED, [sandbox(image=None)], [], Verdict.DELETE, ()),
        (Because.DELETED, [sandbox(phase="Stopped")], [], Verdict.DELETE, ()),
        (
            Because.DELETED,
            [sandbox(uid="uid-9", name="other", namespace="team")],
            [],
            Verdict.KEEP,
            ("Sandbox team/other",),
        ),
        (
            Because.RESTORED,
            [sandbox(image=None)],
            [snapshot()],
            Verdict.KEEP,
            ("SandboxSnapshot ns/shot",),
        ),
        (Because.DELETED, [], [snapshot()], Verdict.KEEP, ("SandboxSnapshot ns/shot",)),
        (
            Because.DELETED,
            [],
            [snapshot(deleting=True)],
            Verdict.KEEP,
            ("SandboxSnapshot ns/shot",),
        ),
        (Because.RESTORED, [], [snapshot(f"r/s:snapshot-s1@{OTHER}")], Verdict.DELETE, ()),
        (
            Because.RESTORED,
            [],
            [snapshot(None, phase="Taking")],
            Verdict.WAIT,
            ("SandboxSnapshot ns/shot (being taken)",),
        ),
        (Because.RESTORED, [], [snapshot(None, phase="Taking", of="else")], Verdict.DELETE, ()),
        (
            Because.RESTORED,
            [],
            [snapshot(None, phase="Pending", namespace="team")],
            Verdict.DELETE,
            (),
        ),
        (Because.RESTORED, [], [snapshot(None, phase="Failed")], Verdict.DELETE, ()),
        (
            Because.RESTORED,
            [sandbox()],
            [snapshot(None, phase="Taking")],
            Verdict.KEEP,
            ("Sandbox ns/sb",),
        ),
    ],
    ids=[
        "restored-nothing-names-it",
        "gone-nothing-names-it",
        "name-reused-by-another-sandbox",
        "moved-to-another-node-keeps-it",
        "same-uid-restored-elsewhere-is-that-nodes-to-delete",
        "an-ended-sandbox-names-nothing",
        "another-sandbox-anywhere-naming-the-digest-keeps-it",
        "restored-but-a-snapshots-pushed-copy-shares-the-digest",
        "deleted-but-a-snapshots-pushed-copy-shares-the-digest",
        "a-snapshot-being-deleted-still-keeps-it-for-its-forks",
        "a-snapshot-pushed-under-another-digest-does-not",
        "a-snapshot-being-taken-of-the-sandbox-makes-it-wait",
        "a-snapshot-being-taken-of-another-sandbox-does-not",
        "a-snapshot-being-taken-in-another-namespace-does-not",
        "a-failed-snapshot-does-not",
        "a-settled-holder-wins-over-waiting",
    ],
)
def test_a_digest_goes_only_when_nothing_names_it(
    because: Because,
    sandboxes: list[dict[str, Any]],
    snapshots: list[dict[str, Any]],
    verdict: Verdict,
    holders: tuple[str, ...],
) -> None:
    judged = judge_deletion(state(because), sandboxes, snapshots)
    assert (judged.verdict, judged.holders) == (verdict, holders)


def test_a_deleted_snapshots_copy_goes_unless_its_sandbox_still_names_the_digest() -> None:
    copy = pushed_copy(snapshot())
    assert copy == PushedState(SHOT_REF, "ns/shot", "s1", Because.SNAPSHOT_DELETED)
    assert pushed_copy(snapshot(None)) is None
    assert judge_deletion(copy, [], []).verdict is Verdict.DELETE
    kept = judge_deletion(copy, [sandbox()], [])  # the suspended sandbox it was copied from
    assert (kept.verdict, kept.holders) == (Verdict.KEEP, ("Sandbox ns/sb",))
    # its own sandbox's later snapshot being taken is no reason to wait for a copy's delete
    assert judge_deletion(copy, [], [snapshot(None, phase="Taking", of="shot")]).verdict is (
        Verdict.DELETE
    )


def test_judge_deletions_says_which_digests_may_go() -> None:
    lone = PushedState(f"reg.example/sandlot/state:uid-2@{OTHER}", "ns/b", "uid-2", Because.DELETED)
    judged = judge_deletions([state(Because.RESTORED), lone], [], [snapshot()])
    assert {ref: j.verdict for ref, j in judged.items()} == {
        REF: Verdict.KEEP,
        lone.reference: Verdict.DELETE,
    }


def test_a_state_is_queued_once_and_the_list_is_bounded() -> None:
    pending = queued([], state(), NOW)
    assert queued(pending, state(), NOW + timedelta(seconds=1)) == pending
    many: list[Pending] = []
    for i in range(MAX_PENDING + 3):
        many = queued(many, state(ref=f"{REF[:-3]}{i:03d}"), NOW)
    assert len(many) == MAX_PENDING
    assert many[0].state.reference.endswith("003")  # the oldest were dropped


def test_a_failed_delete_backs_off_doubling_to_its_cap_then_is_left_behind() -> None:
    entry: Pending | None = Pending(state(), 0, NOW)
    waits = []
    while entry is not None:
        last, entry = entry, retry_after_failure(entry, NOW)
        if entry is not None:
            waits.append((entry.not_before - NOW).total_seconds())
    assert waits == [10, 20, 40, 80, 160, 320, 600]
    assert last.attempts == MAX_ATTEMPTS - 1


def test_due_now_takes_the_oldest_due_entries_up_to_the_limit() -> None:
    entries = [
        Pending(state(ref=f"{REF}{i}"), 0, NOW + timedelta(seconds=s))
        for i, s in enumerate((0, 30, -5, 0))
    ]
    assert [p.state.reference[-1] for p in due_now(entries, NOW, 2)] == ["0", "2"]


class Store:
    """The state repository at the operator's boundary: deletes recorded, failures scripted."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.failures = 0

    def forget(self, reference: str) -> None:
        if self.failures:
            self.failures -= 1
            raise RegistryError("HTTP 503 Service Unavailable")
        self.deleted.append(reference)


def deletes(
    store: Store,
    clock: FakeClock,
    sandboxes: Sequence[dict[str, Any]] = (),
    snapshots: Sequence[dict[str, Any]] = (),
) -> tuple[StateDeletes, FakeObjects]:
    objects = FakeObjects(clock.now)
    objects.sandboxes = {
        f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in sandboxes
    }
    objects.snapshots = {
        f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in snapshots
    }
    return StateDeletes(store, objects, clock.now), objects


def restored(queue: StateDeletes, sb: dict[str, Any]) -> None:
    """The sandbox feed as a restore looks to it: the state named, then cleared; the
    pass that follows tries the delete."""
    queue.on_sandbox("MODIFIED", sb)
    cleared = {**sb, "status": {**sb["status"], "suspendedState": None}}
    queue.on_sandbox("MODIFIED", cleared)
    queue.pass_once()


def test_a_deleted_sandbox_state_goes_on_the_next_pass_a_moved_one_stays() -> None:
    clock, store = FakeClock(), Store()
    gone, _ = deletes(store, clock)
    gone.deleted(sandbox())
    assert store.deleted == []  # noted on the watch thread, nothing called there
    gone.pass_once()
    assert store.deleted == [REF]
    assert gone.pending() == []

    moved, _ = deletes(store, clock, [sandbox()])  # still there, same uid: another node's now
    moved.deleted(sandbox())
    moved.pass_once()
    assert store.deleted == [REF]
    assert moved.pending() == []


def test_a_restored_state_a_snapshot_shares_is_kept_and_its_last_referrer_deletes_it() -> None:
    clock, store = FakeClock(), Store()
    queue, objects = deletes(store, clock, [sandbox(image=None)], [snapshot()])
    restored(queue, sandbox())
    assert store.deleted == [] and queue.pending() == []  # kept for the snapshot, not retried
    gone = objects.snapshots.pop("ns/shot")
    queue.snapshot_deleted(gone)
    queue.pass_once()
    assert store.deleted == [SHOT_REF]  # the one digest, by its last referrer


def test_a_state_waits_for_a_snapshot_being_taken_then_goes() -> None:
    clock, store = FakeClock(), Store()
    queue, objects = deletes(store, clock, [], [snapshot(None, phase="Taking")])
    restored(queue, sandbox())
    assert store.deleted == [] and [p.attempts for p in queue.pending()] == [1]
    objects.snapshots["ns/shot"]["status"] = {"phase": "Ready", "pushedImage": f"r/s:t@{OTHER}"}
    clock.advance(10)
    queue.pass_once()
    assert store.deleted == [REF]


def test_an_unreadable_api_keeps_the_state_for_a_later_pass() -> None:
    clock, store = FakeClock(), Store()
    queue, objects = deletes(store, clock)
    objects.faults["list"] = [RuntimeError("the API server is away")]
    queue.deleted(sandbox())
    queue.pass_once()
    assert store.deleted == [] and [p.attempts for p in queue.pending()] == [1]
    clock.advance(10)
    queue.pass_once()
    assert store.deleted == [REF]


def test_a_failed_delete_is_tried_again_by_a_later_pass_once_due() -> None:
    clock, store = FakeClock(), Store()
    store.failures = 1
    queue, _ = deletes(store, clock)
    restored(queue, sandbox())  # the pass's try fails
    assert store.deleted == []
    assert [p.attempts for p in queue.pending()] == [1]
    queue.pass_once()
    assert store.deleted == []  # not due yet
    clock.advance(10)
    queue.pass_once()
    assert store.deleted == [REF]
    assert queue.pending() == []


def test_a_pass_tries_at_most_its_limit() -> None:
    clock, store = FakeClock(), Store()
    queue, _ = deletes(store, clock)
    for i in range(PASS_LIMIT + 2):
        queue.deleted(sandbox(uid=f"uid-{i}", image=f"{REF[:-3]}{i:03d}"))
    queue.pass_once()
    assert len(store.deleted) == PASS_LIMIT
    queue.pass_once()
    assert len(store.deleted) == PASS_LIMIT + 2


def test_a_deleted_owners_key_goes_at_the_next_pass_and_a_restore_keeps_it() -> None:
    clock, store = FakeClock(), Store()
    keys: list[str] = []
    queue = StateDeletes(store, FakeObjects(clock.now), clock.now, keys.append)
    restored(queue, sandbox())
    assert keys == [], "a restored sandbox lost its key: its next suspend could not push"
    queue.on_sandbox("DELETED", sandbox(image=None))
    shot = snapshot()
    queue.on_snapshot("MODIFIED", shot)
    queue.on_snapshot("DELETED", shot)
    assert keys == []  # noted on the loop, nothing called there
    queue.pass_once()
    assert keys == ["uid-1", shot["metadata"]["uid"]]
    queue.pass_once()  # once more: a brokering racing the deletion may have made it again
    queue.pass_once()
    assert keys == ["uid-1", shot["metadata"]["uid"]] * 2


def test_a_key_whose_delete_fails_is_tried_again_at_the_next_pass() -> None:
    clock, store = FakeClock(), Store()
    calls: list[str] = []

    def delete_key(owner: str) -> None:
        calls.append(owner)
        if len(calls) == 1:
            raise RuntimeError("the API server is away")

    queue = StateDeletes(store, FakeObjects(clock.now), clock.now, delete_key)
    queue.on_sandbox("DELETED", sandbox(image=None))
    queue.pass_once()
    queue.pass_once()
    assert calls == ["uid-1", "uid-1"]
    queue.pass_once()
    queue.pass_once()
    assert calls == ["uid-1", "uid-1", "uid-1"], "a deleted key not deleted exactly twice"
