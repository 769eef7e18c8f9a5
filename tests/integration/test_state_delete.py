"""``RegistryClient.delete_manifest`` against real registries: the one behind
htpasswd (deletes enabled), one behind bearer tokens, one with deletes disabled
(the distribution registry's default, answering 405 UNSUPPORTED); and a scripted
registry for what a real one would not do on request (a challenge naming no scope,
a server error)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import Credential, Endpoint, RegistryClient, RegistryError
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.controllers.statedeletes import StateRepository
from sandlot.devtools.registry import LOOPBACK_HOSTS
from sandlot.policy.pulling import FailureKind
from tests.support.registry import (
    AUTH_PASSWORD,
    AUTH_USER,
    LOOPBACK_ACCESS,
    Registry,
    running_registry,
    scripted_server,
)

pytest_plugins = ["tests.support.registry"]
pytestmark = [pytest.mark.integration]

CREDENTIAL = Credential(AUTH_USER, AUTH_PASSWORD)
DIGEST = "sha256:" + "3" * 64


def client_for(host: str, repository: str, credential: Credential | None) -> RegistryClient:
    return RegistryClient(
        Endpoint(f"http://{host}"),
        repository,
        credential,
        connect_timeout=5,
        stall_timeout=5,
        deadline=Deadline(30, expired=RuntimeTimeout),
        access=LOOPBACK_ACCESS,
    )


@pytest.fixture(scope="module")
def no_delete_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from running_registry(tmp_path_factory, None, deletes=False)


def test_a_deleted_manifest_is_gone_and_a_second_delete_counts_as_done(
    auth_registry: Registry, push_image: Any
) -> None:
    pushed = push_image(auth_registry, "state/del:t", salt="del")
    client = client_for(auth_registry.host, "state/del", CREDENTIAL)
    try:
        client.manifest_exists(pushed.manifest_digest)
        assert client.delete_manifest(pushed.manifest_digest) is True
        with pytest.raises(RegistryError) as gone:
            client.manifest_exists(pushed.manifest_digest)
        assert gone.value.status == 404
        with pytest.raises(RegistryError):
            client.manifest_exists("t")  # its tag went with it
        assert client.delete_manifest(pushed.manifest_digest) is True  # 404: gone already
    finally:
        client.close()


def test_a_registry_without_deletes_answers_false_and_keeps_the_manifest(
    no_delete_registry: Registry, push_image: Any
) -> None:
    pushed = push_image(no_delete_registry, "state/kept:t", salt="kept")
    client = client_for(no_delete_registry.host, "state/kept", None)
    try:
        assert client.delete_manifest(pushed.manifest_digest) is False
        client.manifest_exists(pushed.manifest_digest)  # still there
    finally:
        client.close()


def test_a_bearer_token_registry_deletes_with_a_token_for_the_delete_action(
    token_registry: Registry, push_image: Any
) -> None:
    pushed = push_image(token_registry, "state/token-del:t", salt="token-del")
    assert token_registry.token_server is not None
    client = client_for(token_registry.host, "state/token-del", CREDENTIAL)
    try:
        assert client.delete_manifest(pushed.manifest_digest) is True
        with pytest.raises(RegistryError) as gone:
            client.manifest_exists(pushed.manifest_digest)
        assert gone.value.status == 404
    finally:
        client.close()
    assert "repository:state/token-del:delete" in token_registry.token_server.scopes


def test_a_challenge_naming_no_scope_gets_a_token_asked_for_delete() -> None:
    asked: list[str] = []

    def server(method: str, path: str, headers: dict[str, str]) -> Any:
        if path.startswith("/token"):
            asked.extend(parse_qs(urlsplit(path).query).get("scope") or [])
            return 200, {"Content-Type": "application/json"}, b'{"token":"t"}'
        if headers.get("Authorization") != "Bearer t":
            realm = f"http://127.0.0.1:{front.port}/token"
            return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="s"'}, b""
        return 202, {}, b""

    with scripted_server(server) as front:
        client = client_for(front.host, "state/x", CREDENTIAL)
        try:
            assert client.delete_manifest(DIGEST) is True
        finally:
            client.close()
        assert asked == ["repository:state/x:delete"]
        assert [(m, p) for m, p, _ in front.requests if m == "DELETE"] == [
            ("DELETE", f"/v2/state/x/manifests/{DIGEST}"),
            ("DELETE", f"/v2/state/x/manifests/{DIGEST}"),
        ]


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (500, b"", FailureKind.TRANSIENT),
        (403, b'{"errors":[{"code":"DENIED"}]}', FailureKind.UNAUTHORIZED),
    ],
    ids=["server-error", "denied"],
)
def test_other_refusals_of_a_delete_raise_for_a_later_try(
    status: int, body: bytes, kind: FailureKind
) -> None:
    with scripted_server(lambda *_: (status, {"Content-Type": "application/json"}, body)) as front:
        client = client_for(front.host, "state/x", None)
        try:
            with pytest.raises(RegistryError) as caught:
                client.delete_manifest(DIGEST)
        finally:
            client.close()
    assert (caught.value.status, caught.value.kind) == (status, kind)


def test_the_store_says_once_that_a_repository_does_not_delete_and_asks_no_more(
    no_delete_registry: Registry, push_image: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pushed = push_image(no_delete_registry, "state/once:t", salt="once")
    store = StateRepository(
        f"{no_delete_registry.host}/state/once",
        "",
        call_timeout=5,
        private_hosts=frozenset(LOOPBACK_HOSTS),
    )
    reference = f"{no_delete_registry.host}/state/once:t@{pushed.manifest_digest}"
    with caplog.at_level(logging.WARNING, logger="sandlot.controllers.statedeletes"):
        store.forget(reference)
        store.forget(reference)
    said = [r for r in caplog.records if "does not delete" in r.getMessage()]
    assert len(said) == 1, caplog.records
    client = client_for(no_delete_registry.host, "state/once", None)
    try:
        client.manifest_exists(pushed.manifest_digest)  # left alone
    finally:
        client.close()
