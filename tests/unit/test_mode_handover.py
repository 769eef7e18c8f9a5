"""A change of mode handed to the sandbox's work from its watch event wakes no sync
pass beside it; every other change still does (``policy.agentsync.pass_wanted``)."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from sandlot.agent.sync import sandbox_listener
from sandlot.policy.agentsync import pass_wanted


def body(mode: str = "Running", version: str = "10", generation: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "sandlot.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "namespace": "ns",
            "name": "box",
            "uid": "uid-1",
            "resourceVersion": version,
            "generation": generation,
            "labels": {"app": "x"},
        },
        "spec": {"image": "busybox", "nodeName": "node-a", "operatingMode": mode},
        "status": {"phase": "Running", "containerId": "c1", "conditions": []},
    }


def paused_spec_write(old: dict[str, Any]) -> dict[str, Any]:
    """``old`` after a spec write that asks for Paused and changes nothing else."""
    new = copy.deepcopy(old)
    new["spec"]["operatingMode"] = "Paused"
    new["metadata"]["resourceVersion"] = "11"
    new["metadata"]["generation"] = 4
    new["metadata"]["managedFields"] = [{"manager": "sdk", "operation": "Update"}]
    return new


def changed(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """The Paused spec write, with one more field set."""
    new = paused_spec_write(body())
    target = new
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value
    return new


WAKES = {
    "mode-alone-handed-over": (paused_spec_write(body()), True, False),
    "mode-alone-not-handed-over": (paused_spec_write(body()), False, True),
    "mode-and-deletion": (
        changed(("metadata", "deletionTimestamp"), "2026-01-01T12:00:00Z"),
        True,
        True,
    ),
    "mode-and-a-label": (changed(("metadata", "labels"), {"app": "y"}), True, True),
    "mode-and-another-spec-field": (changed(("spec", "nodeName"), "node-b"), True, True),
    "mode-and-status": (changed(("status", "phase"), "Stopped"), True, True),
}


@pytest.mark.parametrize(("new", "handed", "wakes"), WAKES.values(), ids=list(WAKES))
def test_only_a_change_of_mode_handed_over_whole_wakes_no_pass(
    new: dict[str, Any], handed: bool, wakes: bool
) -> None:
    assert pass_wanted(body(), new, handed) is wakes


def test_an_added_or_deleted_sandbox_wakes_a_pass_whatever_was_handed() -> None:
    assert pass_wanted(None, body(), True)
    assert pass_wanted(body(), None, True)


class Listened:
    """``sandbox_listener`` over a sync whose hand-over answers ``takes``."""

    def __init__(self, takes: bool) -> None:
        self.handed: list[dict[str, Any]] = []
        self.wake = threading.Event()
        self.looked_again = 0

        def mode_changed(obj: dict[str, Any]) -> bool:
            self.handed.append(obj)
            return takes

        def suspends_changed() -> None:
            self.looked_again += 1

        sync = SimpleNamespace(mode_changed=mode_changed)
        uses = SimpleNamespace(suspends=SimpleNamespace(changed=suspends_changed))
        self.listener = sandbox_listener(sync, self.wake, uses)  # type: ignore[arg-type]


def test_a_pause_handed_over_at_once_runs_without_a_pass_beside_it() -> None:
    seen = Listened(takes=True)
    new = paused_spec_write(body())
    seen.listener("MODIFIED", body(), new)
    assert seen.handed == [new], "the pause was not handed to the sandbox's work"
    assert not seen.wake.is_set(), "a sync pass woken beside a pause it can only skip"
    assert seen.looked_again == 1, "a use waiting on the sandbox was not told"


@pytest.mark.parametrize(
    ("takes", "event", "old", "new"),
    [
        (False, "MODIFIED", body(), paused_spec_write(body())),
        (True, "MODIFIED", body(), changed(("status", "phase"), "Stopped")),
        (True, "MODIFIED", body(), body(version="11")),
        (True, "ADDED", None, body()),
        (True, "DELETED", body(), None),
        (True, "LISTED", None, None),
    ],
    ids=["not-handed-over", "mode-and-status", "no-mode-change", "added", "deleted", "listed"],
)
def test_every_other_change_wakes_a_pass(
    takes: bool, event: str, old: dict[str, Any] | None, new: dict[str, Any] | None
) -> None:
    seen = Listened(takes=takes)
    seen.listener(event, old, new)
    assert seen.wake.is_set()
