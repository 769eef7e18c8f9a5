"""The agent's store of suspended state: names, credential, and what it refuses."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandlot.adapters.pulling import Credential, Pushed, RegistryError
from sandlot.agent import statestore
from sandlot.agent.statestore import StateStore
from sandlot.policy.pulling import FailureKind
from tests.support.agent import FakeRuntime

DIGEST = "sha256:" + "2" * 64


def settings(repository: str, auth_file: str = "") -> Any:
    return SimpleNamespace(
        suspend_state_repository=repository,
        suspend_state_auth_file=auth_file,
        image_pull_deadline=timedelta(seconds=5),
        image_pull_stall_timeout=timedelta(seconds=1),
        call_timeout=timedelta(seconds=1),
        registry_config_dir="",
        registry_private_hosts=[],
        registry_redirect_hosts=[],
        node_address="",
        containerd_address="/nonexistent",
        containerd_namespace="ns",
    )


class Runtime(FakeRuntime):
    """A node whose every image has an empty OCI manifest."""

    def image_manifest(self, image: str, *, timeout: float) -> tuple[bytes, str]:
        return b"{}", "application/vnd.oci.image.manifest.v1+json"


def test_none_without_a_repository() -> None:
    assert StateStore.from_settings(settings(""), Runtime(), None) is None


def keys(owner: str) -> bytes | None:
    return b"k" * 32 if owner == "uid-1" else None


def test_the_pushed_reference_is_named_as_the_repository_not_its_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []

    def push(client: Any, tag: str, *args: Any) -> Pushed:
        seen.append((client.endpoint.url, client.repository, tag))
        return Pushed(f"registry-1.docker.io/sandlot/state:{tag}@{DIGEST}", DIGEST, 1)

    monkeypatch.setattr(statestore, "push_sealed", push)
    store = StateStore(settings("docker.io/sandlot/state"), Runtime(), keys)
    pushed = store.push("uid-1", "uid-1", "sandlot.local/suspended/uid-1:latest")
    assert pushed.reference == f"docker.io/sandlot/state:uid-1@{DIGEST}"
    assert seen == [("https://registry-1.docker.io", "sandlot/state", "uid-1")]


@pytest.mark.parametrize(
    "reference",
    [
        f"reg.example/other/repo:u@{DIGEST}",  # another repository of the same registry
        f"evil.example/sandlot/state:u@{DIGEST}",  # the same path elsewhere
        "not a reference",
    ],
)
def test_a_pull_outside_the_state_repository_is_refused(reference: str) -> None:
    store = StateStore(settings("reg.example/sandlot/state"), Runtime(), keys)
    with pytest.raises(RegistryError):
        store.pull(reference, "sandlot.local/suspended/u:latest", "uid-1")


def test_no_push_or_pull_without_the_owners_key_brokered_here() -> None:
    store = StateStore(settings("reg.example/sandlot/state"), Runtime(), keys)
    with pytest.raises(RegistryError, match="no state key of uid-2") as pushing:
        store.push("uid-2", "uid-2", "sandlot.local/suspended/uid-2:latest")
    assert pushing.value.kind is FailureKind.TRANSIENT  # brokered once the node needs it
    with pytest.raises(RegistryError, match="no state key of uid-2"):
        store.pull(f"reg.example/sandlot/state:uid-2@{DIGEST}", "x:latest", "uid-2")


def test_the_credential_is_the_one_for_the_state_registry_only(tmp_path: Path) -> None:
    auth = base64.b64encode(b"state:pw").decode()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"auths": {"reg.example": {"auth": auth}}}))
    store = StateStore(settings("reg.example/sandlot/state", str(path)), Runtime(), keys)
    assert store._credential("reg.example") == Credential("state", "pw")
    assert store._credential("other.example") is None
    missing = StateStore(
        settings("reg.example/sandlot/state", str(tmp_path / "none")), Runtime(), keys
    )
    assert missing._credential("reg.example") is None
