"""kopf keeps no per-object memory for the kinds the operator only watches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import kopf
import pytest

from sandlot.adapters.kopfprivate import WatchOnlyMemories, watch_only_kinds
from sandlot.api.common import API_VERSION, GROUP, VERSION


async def _noop(**_: Any) -> None:
    return None


def _event(plural: str) -> Callable[[kopf.OperatorRegistry], object]:
    return lambda r: kopf.on.event(GROUP, VERSION, plural, registry=r)(_noop)


def _timer(plural: str) -> Callable[[kopf.OperatorRegistry], object]:
    return lambda r: kopf.timer(GROUP, VERSION, plural, interval=30, registry=r)(_noop)


def _on_delete(plural: str) -> Callable[[kopf.OperatorRegistry], object]:
    return lambda r: kopf.on.delete(GROUP, VERSION, plural, registry=r)(_noop)


@pytest.mark.parametrize(
    ("handlers", "expected"),
    [
        ([_event("sandboxes")], {"Sandbox"}),
        ([_event("sandboxes"), _timer("sandboxes")], set()),
        ([_event("sandboxes"), _on_delete("sandboxes")], set()),
        ([_event("sandboxnodes"), _timer("sandboxnodes"), _event("sandboxes")], {"Sandbox"}),
        ([_event("sandboxpools"), _event("cacheprunes")], {"SandboxPool", "CachePrune"}),
        ([_timer("sandboxes")], set()),
    ],
    ids=[
        "event_only_kind_keeps_no_memory",
        "a_timer_on_the_kind_keeps_its_memory",
        "a_change_handler_on_the_kind_keeps_its_memory",
        "nodes_with_timers_keep_theirs_while_sandboxes_do_not",
        "every_event_only_kind_is_listed",
        "a_kind_without_event_handlers_is_not_listed",
    ],
)
def test_watch_only_kinds_come_from_the_registry(
    handlers: list[Callable[[kopf.OperatorRegistry], object]], expected: set[str]
) -> None:
    registry = kopf.OperatorRegistry()
    for add in handlers:
        add(registry)
    assert watch_only_kinds(registry) == expected


@pytest.mark.parametrize(
    ("kind", "api_version", "kept"),
    [
        ("Sandbox", API_VERSION, False),
        ("SandboxNode", API_VERSION, True),
        ("Sandbox", "other.example/v1", True),
    ],
    ids=[
        "watched_only_kind_is_forgotten",
        "other_kind_is_kept",
        "same_kind_of_another_group_is_kept",
    ],
)
def test_memories_remember_only_what_is_read_again(kind: str, api_version: str, kept: bool) -> None:
    memories = WatchOnlyMemories({"Sandbox"})
    body: kopf.RawBody = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"uid": "u1", "name": "a"},
    }

    async def recall_twice() -> tuple[object, object]:
        first = await memories.recall(body)
        return first, await memories.recall(body)

    first, second = asyncio.run(recall_twice())
    assert (first is second) is kept
    assert len(list(memories.iter_all_memories())) == (1 if kept else 0)
