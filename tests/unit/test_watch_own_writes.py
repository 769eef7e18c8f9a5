"""The agent's view holds its own writes at once, and the watch's late echo of them
(or anything older) never takes them back."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.sandboxwatch import WatchCache
from sandlot.api.common import SANDBOXES, key_of
from sandlot.api.resourceversion import newer
from sandlot.policy.agentsync import SandboxState


def sandbox(version: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "sb", "resourceVersion": version},
        "status": {"phase": phase},
    }


@pytest.fixture
def seen() -> list[tuple[str, str | None]]:
    return []


@pytest.fixture
def watch(seen: list[tuple[str, str | None]]) -> WatchCache:
    def changed(event: str, _old: Any, new: Any) -> None:
        seen.append((event, (new or {}).get("status", {}).get("phase")))

    cache = WatchCache(client.ApiClient(client.Configuration()), SANDBOXES, on_change=changed)
    cache._deliver("ADDED", sandbox("10", "Scheduled"))
    seen.clear()
    return cache


def phase(cache: WatchCache) -> str:
    return str((cache.get("ns/sb") or {})["status"]["phase"])


@pytest.mark.parametrize(
    ("candidate", "than", "expected"),
    [
        ("11", "10", True),
        ("10", "11", False),
        ("10", "10", False),
        ("100", "99", True),  # longer is newer: not a string order
        ("99", "100", False),
        ("010", "9", None),  # a leading zero is not well-formed
        ("abc", "10", None),
        ("10", "", None),
        (None, "10", None),
    ],
)
def test_resource_versions_are_ordered_as_kep_5504_says(
    candidate: str | None, than: str | None, expected: bool | None
) -> None:
    assert newer(candidate, than) is expected


def test_an_own_write_is_seen_at_once_and_its_echo_changes_nothing(
    watch: WatchCache, seen: list[tuple[str, str | None]]
) -> None:
    assert watch.observe(sandbox("12", "Running"))
    assert phase(watch) == "Running"
    assert seen == [("WRITTEN", "Running")]

    watch._deliver("MODIFIED", sandbox("11", "Scheduled"))  # an older event, late
    watch._deliver("MODIFIED", sandbox("12", "Running"))  # the write's own echo
    assert phase(watch) == "Running"
    assert seen == [("WRITTEN", "Running")]

    watch._deliver("MODIFIED", sandbox("13", "Stopped"))  # someone else's, later
    assert phase(watch) == "Stopped"
    assert seen[-1] == ("MODIFIED", "Stopped")


def test_a_write_whose_echo_came_first_is_told_as_written_and_changes_nothing(
    watch: WatchCache, seen: list[tuple[str, str | None]]
) -> None:
    watch._deliver("MODIFIED", sandbox("12", "Running"))  # the echo, before the answer
    written = sandbox("12", "Running")
    written["status"]["note"] = "as the write returned it"
    assert not watch.observe(written)
    assert seen == [("MODIFIED", "Running"), ("WRITTEN", "Running")]
    assert "note" not in (watch.get("ns/sb") or {})["status"], "the map changed for an echo"


def test_a_write_older_than_the_view_or_of_an_unseen_object_is_left_to_the_watch(
    watch: WatchCache, seen: list[tuple[str, str | None]]
) -> None:
    assert not watch.observe(sandbox("9", "Running"))
    other = sandbox("50", "Running")
    other["metadata"]["name"] = "other"
    assert not watch.observe(other)
    assert watch.get("ns/other") is None
    assert phase(watch) == "Scheduled"
    assert seen == []


def test_a_deletion_is_never_held_back_by_a_write(watch: WatchCache) -> None:
    watch.observe(sandbox("12", "Running"))
    watch._deliver("DELETED", sandbox("11", "Scheduled"))
    assert watch.get("ns/sb") is None


def test_versions_that_cannot_be_ordered_keep_the_watch_in_charge(watch: WatchCache) -> None:
    assert not watch.observe(sandbox("x2", "Running"))
    watch._deliver("MODIFIED", sandbox("x1", "Stopped"))
    assert phase(watch) == "Stopped"


def test_a_relist_keeps_a_write_newer_than_what_it_read_and_drops_what_it_lacks(
    watch: WatchCache,
) -> None:
    watch.observe(sandbox("12", "Running"))
    watch._list_began()
    watch._deliver("SYNC", sandbox("11", "Scheduled"))
    watch._listed({"ns/sb"})
    assert phase(watch) == "Running"

    watch._list_began()
    watch._listed(set())  # deleted since: the LIST is the truth
    assert watch.get("ns/sb") is None


def test_one_key_names_an_object_in_every_cache_queue_and_log_line() -> None:
    assert key_of({"metadata": {"namespace": "team-a", "name": "box"}}) == "team-a/box"
    assert key_of({"metadata": {"name": "node-1"}}) == "node-1"  # cluster-scoped
    assert SandboxState.from_object(
        {"metadata": {"namespace": "team-a", "name": "box"}, "spec": {}}
    ).key == key_of({"metadata": {"namespace": "team-a", "name": "box"}})
