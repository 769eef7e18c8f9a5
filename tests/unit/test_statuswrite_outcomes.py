"""``adapters.statuswrite.write_status`` decided on what the Objects boundary answers:
each outcome, on the stateful fake of that boundary (``tests/support/fakeobjects.py``)
with what happened between the read and the write made to happen in it; its real
behaviour against the API server is claimed in tests/integration/test_statuswrite.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.statuswrite import WriteOutcome, write_status
from sandlot.agent.status import StatusWriter
from sandlot.api.sandbox import SandboxPhase
from tests.support.fakeobjects import FakeObjects

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY = "ns/box"


def world(phase: str = "Scheduled") -> tuple[FakeObjects, dict[str, Any]]:
    """The fake holding one Sandbox bound to n1, and that Sandbox as the writer read it."""
    objects = FakeObjects(lambda: T0)
    read = objects.add_sandbox("ns", "box", T0, node="n1", phase=phase)
    return objects, read


def api(status: int) -> ApiException:
    return ApiException(
        status=status,
        reason={
            400: "Bad Request",
            403: "Forbidden",
            409: "Conflict",
            422: "Unprocessable Entity",
            429: "Too Many Requests",
            500: "Boom",
            503: "Service Unavailable",
        }[status],
    )


# What happens to the stored Sandbox after the writer read it (a change by someone
# else gets a new resourceVersion, so the writer's patch meets a real 409).


def nothing(objects: FakeObjects) -> None:
    pass


def changed(objects: FakeObjects) -> None:
    objects.touch(objects.sandboxes[KEY])


def deleted(objects: FakeObjects) -> None:
    del objects.sandboxes[KEY]


def conflict_then_deleted(objects: FakeObjects) -> None:
    objects.fail_next("patch-status", api(409))
    deleted(objects)


def recreated(objects: FakeObjects) -> None:
    objects.sandboxes[KEY]["metadata"]["uid"] = "uid-recreated"
    changed(objects)


def rebound(objects: FakeObjects) -> None:
    objects.sandboxes[KEY]["spec"]["nodeName"] = "n2"
    changed(objects)


def ended_as(phase: str) -> Callable[[FakeObjects], None]:
    def end(objects: FakeObjects) -> None:
        objects.sandboxes[KEY]["status"]["phase"] = phase
        changed(objects)

    return end


def patch_answers(answer: Exception) -> Callable[[FakeObjects], None]:
    return lambda objects: objects.fail_next("patch-status", answer)


def changed_then_reread_answers(answer: Exception) -> Callable[[FakeObjects], None]:
    def happen(objects: FakeObjects) -> None:
        changed(objects)
        objects.fail_next("get", answer)

    return happen


def changed_before_every_patch(objects: FakeObjects) -> None:
    objects.before_write = lambda verb, key: changed(objects)


Happening = Callable[[FakeObjects], None]

# name: (what happens, outcome, status patches sent)
CASES: dict[str, tuple[Happening, WriteOutcome, int]] = {
    "written-first-time": (nothing, WriteOutcome.WRITTEN, 1),
    "conflict-then-written-with-the-reread-version": (changed, WriteOutcome.WRITTEN, 2),
    "not-found-on-patch-is-gone": (deleted, WriteOutcome.GONE, 1),
    "not-found-on-reread-is-gone": (conflict_then_deleted, WriteOutcome.GONE, 1),
    "recreated-new-uid-is-gone": (recreated, WriteOutcome.GONE, 1),
    "rebound-other-node-is-gone": (rebound, WriteOutcome.GONE, 1),
    "terminal-on-reread-is-skipped": (ended_as("Stopped"), WriteOutcome.SKIPPED, 1),
    "dead-on-reread-is-skipped": (ended_as("Dead"), WriteOutcome.SKIPPED, 1),
    "other-api-error-fails": (patch_answers(api(500)), WriteOutcome.FAILED, 1),
    "unavailable-fails": (patch_answers(api(503)), WriteOutcome.FAILED, 1),
    "too-many-requests-fails-transiently": (patch_answers(api(429)), WriteOutcome.FAILED, 1),
    "invalid-is-refused": (patch_answers(api(422)), WriteOutcome.REFUSED, 1),
    "forbidden-is-refused": (patch_answers(api(403)), WriteOutcome.REFUSED, 1),
    "bad-request-is-refused": (patch_answers(api(400)), WriteOutcome.REFUSED, 1),
    "no-answer-fails-without-raising": (
        patch_answers(ConnectionError("reset")),
        WriteOutcome.FAILED,
        1,
    ),
    "reread-error-fails": (changed_then_reread_answers(api(500)), WriteOutcome.FAILED, 1),
    "conflicting-every-time": (changed_before_every_patch, WriteOutcome.CONFLICTED, 3),
}


@pytest.mark.parametrize(("happen", "outcome", "patches"), CASES.values(), ids=list(CASES))
def test_write_outcome(happen: Happening, outcome: WriteOutcome, patches: int) -> None:
    objects, read = world()
    happen(objects)
    stored_before = objects.sandboxes.get(KEY, {}).get("metadata", {}).get("resourceVersion")

    result = write_status(objects, read, {"phase": "Running"}, node="n1", max_attempts=3)

    assert result.outcome is outcome, result
    sent = objects.status_versions
    assert len(sent) == patches, sent
    assert sent[0] == read["metadata"]["resourceVersion"]
    # Each retry carries the version its re-read found, never the one that conflicted.
    assert len(set(sent)) == len(sent), sent
    if patches == 2:
        assert sent[1] == stored_before
    assert (objects.phase(KEY) == "Running") is (outcome is WriteOutcome.WRITTEN)


@pytest.mark.parametrize(
    ("phase", "outcome", "patched"),
    [
        ("Scheduled", WriteOutcome.WRITTEN, True),
        ("Running", WriteOutcome.SKIPPED, False),
        ("Failed", WriteOutcome.SKIPPED, False),
    ],
    ids=["allowed", "not-allowed", "terminal"],
)
def test_allowed_from_is_checked_before_any_write(
    phase: str, outcome: WriteOutcome, patched: bool
) -> None:
    objects, read = world(phase)
    allowed = {SandboxPhase.PENDING, SandboxPhase.SCHEDULED}
    result = write_status(objects, read, {"phase": "Dead"}, allowed_from=allowed)
    assert result.outcome is outcome
    assert bool(objects.status_versions) is patched


def test_node_defaults_to_the_one_the_object_was_read_on() -> None:
    objects, read = world()
    rebound(objects)
    assert write_status(objects, read, {"phase": "Dead"}).outcome is WriteOutcome.GONE
    assert objects.phase(KEY) == "Scheduled"


def test_detail_names_the_failure() -> None:
    objects, read = world()
    objects.fail_next("patch-status", api(500))
    assert write_status(objects, read, {"phase": "Dead"}).detail == "500 Boom"


# The writer's own watch may already hold a later version of the Sandbox than the one
# it decided on (the operator's Scheduled write lands while the agent starts it): the
# write starts from that view, as after the 409 and re-read it would otherwise cost,
# and only when it is the same object at a later version.


def stored_view(objects: FakeObjects) -> dict[str, Any]:
    return copy.deepcopy(objects.sandboxes[KEY])


# name: (what happens, the view handed over (None: the one read), outcome, versions
# the status patches carried ("read" or "stored"), whether a re-read was made)
LATEST_CASES: dict[str, tuple[Happening, bool, WriteOutcome, list[str], bool]] = {
    "later-view-written-at-once": (changed, True, WriteOutcome.WRITTEN, ["stored"], False),
    "later-view-terminal-skipped-unwritten": (
        ended_as("Stopped"),
        True,
        WriteOutcome.SKIPPED,
        [],
        False,
    ),
    "same-view-written-as-read": (nothing, False, WriteOutcome.WRITTEN, ["read"], False),
    "view-behind-the-server-takes-the-conflict": (
        changed,
        False,
        WriteOutcome.WRITTEN,
        ["read", "stored"],
        True,
    ),
    "view-of-a-recreated-sandbox-unused": (recreated, True, WriteOutcome.GONE, ["read"], True),
    "view-bound-elsewhere-unused": (rebound, True, WriteOutcome.GONE, ["read"], True),
}


@pytest.mark.parametrize(
    ("happen", "later", "outcome", "versions", "reread"),
    LATEST_CASES.values(),
    ids=list(LATEST_CASES),
)
def test_a_later_view_of_the_same_sandbox_spares_the_conflict(
    happen: Happening, later: bool, outcome: WriteOutcome, versions: list[str], reread: bool
) -> None:
    objects, read = world()
    happen(objects)
    stored = objects.sandboxes[KEY]["metadata"]["resourceVersion"]
    latest = stored_view(objects) if later else copy.deepcopy(read)
    gets: list[str] = []
    get_sandbox = objects.get_sandbox

    def counted(namespace: str, name: str) -> dict[str, Any]:
        gets.append(name)
        return get_sandbox(namespace, name)

    objects.get_sandbox = counted  # type: ignore[method-assign]

    result = write_status(objects, read, {"phase": "Running"}, node="n1", latest=latest)

    assert result.outcome is outcome, result
    named = {"read": read["metadata"]["resourceVersion"], "stored": stored}
    assert objects.status_versions == [named[v] for v in versions]
    assert bool(gets) is reread


def test_the_agents_writes_start_from_its_watchs_view() -> None:
    objects, read = world()
    changed(objects)  # the operator's Scheduled write, say: the watch has brought it
    watched = {KEY: stored_view(objects)}
    writer = StatusWriter(objects, "n1", lambda: T0, latest=watched.get)  # type: ignore[arg-type]
    assert writer.write(read, {"phase": "Running"}) is WriteOutcome.WRITTEN
    assert objects.status_versions == [watched[KEY]["metadata"]["resourceVersion"]]
