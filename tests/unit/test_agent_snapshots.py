"""The agent's take of a snapshot over a fake runtime: what it freezes and thaws,
what it writes, and a refusal."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.runtime import UNSUPPORTED, ImageConfig, RuntimeError_, TaskState
from sandlot.agent.snapshots import KEY_WAIT, Snapshots
from tests.support.agent import FakeRuntime

NOW = datetime(2030, 1, 2, tzinfo=UTC)


class Cache:
    """A watch cache's readers over a dict."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects
        self.synced = threading.Event()
        self.synced.set()

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objects.get(key)

    def items(self) -> list[dict[str, Any]]:
        return list(self.objects.values())


class Refusing(FakeRuntime):
    def commit_container(
        self, container_id: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        self._record("commit_container", container_id)
        raise RuntimeError_("its snapshot is a shifted copy", UNSUPPORTED)


def world(rt: FakeRuntime, conditions: list[dict[str, Any]] | None = None) -> Any:
    sb = {
        "metadata": {"name": "src", "namespace": "ns", "uid": "sbuid"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "conditions": conditions or []},
    }
    snap = {
        "metadata": {"name": "s", "namespace": "ns", "uid": "snapuid"},
        "spec": {"sandboxName": "src", "nodeName": "n1"},
    }
    writes: list[dict[str, Any]] = []

    def patch_snapshot(ns: str, name: str, body: dict[str, Any], status: bool) -> dict[str, Any]:
        writes.append(body["status"])
        return {}

    objects = SimpleNamespace(patch_snapshot=patch_snapshot)
    settings = SimpleNamespace(image_pull_deadline=timedelta(seconds=60))
    work = SimpleNamespace(rt=rt, call_timeout=5.0, settings=settings, node="n1", objects=objects)
    submitted: list[str] = []
    pool = SimpleNamespace(submit=lambda key, _work: submitted.append(key))
    taker = Snapshots(
        work,  # type: ignore[arg-type]
        pool,  # type: ignore[arg-type]
        Cache({"ns/s": snap}),  # type: ignore[arg-type]
        Cache({"ns/src": sb}),  # type: ignore[arg-type]
        lambda: NOW,
    )
    return taker, writes, submitted


def test_a_running_sandbox_is_frozen_for_the_commit_and_thawed_after() -> None:
    rt = FakeRuntime()
    rt.add("sb-sbuid")
    taker, writes, _ = world(rt)
    taker.take("ns/s", "ns/src")
    steps = [c for c in rt.calls if c[0] in ("pause_task", "commit_container", "resume_task")]
    assert steps == [
        ("pause_task", "sb-sbuid"),
        ("commit_container", "sb-sbuid"),
        ("resume_task", "sb-sbuid"),
    ]
    assert rt.tasks["sb-sbuid"].state is TaskState.RUNNING
    assert [w["phase"] for w in writes] == ["Taking", "Ready"]
    assert writes[1]["imageRef"] == "sandlot.local/snapshots/snapuid:latest"
    assert writes[1]["digest"].startswith("sha256:") and writes[1]["takenAt"] == NOW.isoformat()
    assert "sandlot.local/snapshots/snapuid:latest" in rt.images


def test_a_paused_sandbox_is_committed_as_it_is_and_stays_paused() -> None:
    rt = FakeRuntime()
    rt.add("sb-sbuid", state=TaskState.PAUSED)
    taker, writes, _ = world(rt)
    taker.take("ns/s", "ns/src")
    assert not [c for c in rt.calls if c[0] in ("pause_task", "resume_task")]
    assert rt.tasks["sb-sbuid"].state is TaskState.PAUSED
    assert writes[-1]["phase"] == "Ready"


def test_a_refused_commit_thaws_the_sandbox_and_fails_the_snapshot() -> None:
    rt = Refusing()
    rt.add("sb-sbuid")
    taker, writes, submitted = world(rt)
    taker.pass_once()
    assert submitted == ["ns/src"], "queued under its sandbox's key"
    taker.take("ns/s", "ns/src")
    assert rt.tasks["sb-sbuid"].state is TaskState.RUNNING
    assert [w["phase"] for w in writes] == ["Taking", "Failed"]
    assert writes[1]["reason"] == "TakeFailed" and "shifted copy" in writes[1]["message"]
    taker.pass_once()  # the cache does not say Failed yet: not taken again all the same
    assert submitted == ["ns/src"]


def test_a_suspended_sandboxs_image_is_named_again() -> None:
    rt = FakeRuntime()
    rt.images["sandlot.local/suspended/sbuid:latest"] = ImageConfig()
    suspended = [{"type": "Suspended", "status": "True", "reason": "Suspended"}]
    taker, writes, _ = world(rt, suspended)
    taker.take("ns/s", "ns/src")
    assert ("copy_image", "sandlot.local/suspended/sbuid:latest") in rt.calls
    assert "sandlot.local/snapshots/snapuid:latest" in rt.images
    assert writes[-1]["phase"] == "Ready"


class KeyedStore:
    """The state store at the agent's boundary: the keys brokered here, the pushes."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.pushed: list[tuple[str, str]] = []

    def has_key(self, owner: str) -> bool:
        return owner in self.keys

    def push(self, owner: str, tag: str, image: str) -> Any:
        if owner not in self.keys:
            raise RegistryError(f"no state key of {owner} brokered to this node (yet)")
        self.pushed.append((owner, tag))
        return SimpleNamespace(reference=f"reg/state:{tag}@sha256:{'0' * 64}")


def test_a_take_waits_for_the_snapshots_key_then_pushes_sealed_under_it() -> None:
    rt = FakeRuntime()
    rt.add("sb-sbuid")
    taker, writes, _ = world(rt)
    store = KeyedStore()
    taker.store = store
    taker.take("ns/s", "ns/src")
    assert writes == [] and not [c for c in rt.calls if c[0] == "commit_container"]
    store.keys.add("snapuid")  # the operator brokered it
    taker.take("ns/s", "ns/src")
    assert store.pushed == [("snapuid", "snapshot-snapuid")]
    assert writes[-1]["pushedImage"].startswith("reg/state:snapshot-snapuid@")


def test_a_take_whose_key_never_comes_is_taken_unpushed_after_the_wait() -> None:
    rt = FakeRuntime()
    rt.add("sb-sbuid")
    now = [NOW]
    taker, writes, _ = world(rt)
    taker.clock = lambda: now[0]
    store = KeyedStore()
    taker.store = store
    taker.take("ns/s", "ns/src")
    now[0] = NOW + KEY_WAIT - timedelta(seconds=1)
    taker.take("ns/s", "ns/src")
    assert writes == []
    now[0] = NOW + KEY_WAIT
    taker.take("ns/s", "ns/src")
    assert [w["phase"] for w in writes] == ["Taking", "Ready"]
    assert "pushedImage" not in writes[-1] and store.pushed == []
    assert "not pushed (no state key of snapuid" in writes[-1]["message"]
