"""Which pushed suspended states are due for deletion, and how a failed delete is
tried again: ``policy.statedeletion`` with plain data, and the agent's pending list
(``agent.statedeletes``) over a store and a Sandbox reader at its own boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandlot.adapters.pulling import RegistryError
from sandlot.agent.statedeletes import PASS_LIMIT, StateDeletes
from sandlot.policy.statedeletion import (
    MAX_ATTEMPTS,
    MAX_PENDING,
    Because,
    Pending,
    PushedState,
    deletion_due,
    due_now,
    pushed_state,
    queued,
    retry_after_failure,
)
from tests.support.clock import FakeClock

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
REF = "reg.example/sandlot/state:uid-1@sha256:" + "1" * 64


def sandbox(uid: str = "uid-1", image: str | None = REF) -> dict[str, Any]:
    status = {"suspendedState": {"image": image, "digest": "d", "node": "a"}} if image else {}
    return {"metadata": {"namespace": "ns", "name": "sb", "uid": uid}, "status": status}


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
    ("because", "current", "due"),
    [
        (Because.RESTORED, sandbox(image=None), True),
        (Because.DELETED, None, True),
        (Because.DELETED, sandbox(uid="uid-2", image=None), True),
        (Because.DELETED, sandbox(), False),
        (Because.DELETED, sandbox(image=None), False),
    ],
    ids=[
        "restored-is-due-at-once",
        "gone-is-due",
        "name-reused-by-another-sandbox-is-due",
        "moved-to-another-node-keeps-it",
        "same-uid-restored-elsewhere-is-that-nodes-to-delete",
    ],
)
def test_deletion_is_due_only_once_nothing_can_restore_it(
    because: Because, current: dict[str, Any] | None, due: bool
) -> None:
    assert deletion_due(state(because), current) is due


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
    """The state store at the agent's boundary: deletes recorded, failures scripted."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.failures = 0

    def forget(self, reference: str) -> None:
        if self.failures:
            self.failures -= 1
            raise RegistryError("HTTP 503 Service Unavailable")
        self.deleted.append(reference)


def deletes(store: Store, current: dict[str, Any] | None, clock: FakeClock) -> StateDeletes:
    return StateDeletes(store, lambda _ns, _name: current, clock.now)  # type: ignore[arg-type]


def test_a_deleted_sandbox_state_goes_on_the_next_pass_a_moved_one_stays() -> None:
    clock, store = FakeClock(), Store()
    gone = deletes(store, None, clock)
    gone.deleted(sandbox())
    assert store.deleted == []  # noted on the watch thread, nothing called there
    gone.pass_once()
    assert store.deleted == [REF]
    assert gone.pending() == []

    moved = deletes(store, sandbox(), clock)  # still there, same uid: another node's now
    moved.deleted(sandbox())
    moved.pass_once()
    assert store.deleted == [REF]
    assert moved.pending() == []


def test_a_failed_delete_is_tried_again_by_a_later_pass_once_due() -> None:
    clock, store = FakeClock(), Store()
    store.failures = 1
    queue = deletes(store, None, clock)
    queue.restored(sandbox())  # the restore's own try fails
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
    queue = deletes(store, None, clock)
    for i in range(PASS_LIMIT + 2):
        queue.deleted(sandbox(uid=f"uid-{i}", image=f"{REF[:-3]}{i:03d}"))
    queue.pass_once()
    assert len(store.deleted) == PASS_LIMIT
    queue.pass_once()
    assert len(store.deleted) == PASS_LIMIT + 2
