"""pytest fixtures for a real image registry on loopback (``sandlot.devtools.registry``):
load with ``pytest_plugins = ["tests.support.registry"]``.

- ``registry`` (session): an anonymous registry;
- ``auth_registry`` (session): one behind htpasswd, user ``puller``/``s3cret``;
- ``push_image`` (session): ``push(registry, "repo:tag", **build_options)`` builds
  an archive and pushes it, returning its ``ImageArchive``.

Nothing about the registry is faked: the agent's client meets the same answers,
errors and auth challenges a registry in a cluster gives. ``scripted_server``
plays what a real registry would not do on request (redirect elsewhere, name a
token realm at a private address): a plain HTTP server on a loopback address.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandlot.devtools.registry import (
    LOOPBACK_HOSTS,
    Registry,
    StallingProxy,
    free_port,
    start_registry,
    unavailable_reason,
)
from sandlot.policy.pulling import RegistryAccess

LOOPBACK_ACCESS = RegistryAccess(private_hosts=frozenset(LOOPBACK_HOSTS))
"""What a puller of these registries (all on loopback) must be allowed."""

AUTH_USER = "puller"
AUTH_PASSWORD = "s3cret"


def running_registry(
    tmp_path_factory: pytest.TempPathFactory, users: dict[str, str] | None, *, deletes: bool = True
) -> Iterator[Registry]:
    """A registry on loopback for a fixture's scope (skipped where none can run)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    registry = start_registry(tmp_path_factory.mktemp("registry"), users=users, deletes=deletes)
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from running_registry(tmp_path_factory, None)


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from running_registry(tmp_path_factory, {AUTH_USER: AUTH_PASSWORD})


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry behind bearer-token auth (a token server on loopback signs the
    tokens the registry verifies); ``puller``/``s3cret`` may pull and push,
    anonymous clients may pull."""
    from sandlot.devtools.tokenauth import TokenServer

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("token-registry")
    tokens = TokenServer(root / "tokens", {AUTH_USER: AUTH_PASSWORD}, anonymous_pull=True)
    registry = start_registry(root, users={AUTH_USER: AUTH_PASSWORD}, token_server=tokens)
    try:
        yield registry
    finally:
        registry.stop()
        tokens.close()


class ScriptedServer:
    """A plain HTTP server on a loopback address whose every answer ``answer`` gives,
    as ``(status, headers, body)`` for ``(method, path, headers)``: a registry or token
    realm that redirects or challenges as a test needs. It records what it was sent."""

    def __init__(
        self,
        answer: Callable[[str, str, dict[str, str]], tuple[int, dict[str, str], bytes]],
        address: str = "127.0.0.1",
    ) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                headers = dict(self.headers.items())
                server.requests.append((self.command, self.path, headers))
                status, extra, body = answer(self.command, self.path, headers)
                self.send_response(status)
                for name, value in {**extra, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_DELETE = _answer

        self._server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.address = address
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return f"{self.address}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def scripted_server(
    answer: Callable[[str, str, dict[str, str]], tuple[int, dict[str, str], bytes]],
    address: str = "127.0.0.1",
) -> Iterator[ScriptedServer]:
    server = ScriptedServer(answer, address)
    try:
        yield server
    finally:
        server.close()


PushImage = Callable[..., Any]


@pytest.fixture(scope="session")
def push_image(tmp_path_factory: pytest.TempPathFactory) -> PushImage:
    """``push(registry, "repo:tag", **build_options)``: build an archive, push it,
    return the ``ImageArchive`` (its ``name`` is the pushed reference)."""
    from sandlot.devtools.ociarchive import ImageArchive, build_image_archive

    directory = tmp_path_factory.mktemp("pushed")

    def push(registry: Registry, repo_tag: str, **options: Any) -> ImageArchive:
        ref = registry.ref(repo_tag)
        archive = directory / (ref.replace("/", "_").replace(":", "_") + ".tar")
        built = build_image_archive(archive, ref, **options)
        registry.push(archive, repo_tag)
        return built

    return push


__all__ = [
    "AUTH_PASSWORD",
    "AUTH_USER",
    "LOOPBACK_ACCESS",
    "Registry",
    "ScriptedServer",
    "StallingProxy",
    "auth_registry",
    "free_port",
    "push_image",
    "registry",
    "scripted_server",
    "start_registry",
    "token_registry",
]
