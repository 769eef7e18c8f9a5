"""pytest fixtures for a real image registry on loopback (``sandlot.devtools.registry``):
load with ``pytest_plugins = ["tests.support.registry"]``.

- ``registry`` (session): an anonymous registry;
- ``auth_registry`` (session): one behind htpasswd, user ``puller``/``s3cret``;
- ``push_image`` (session): ``push(registry, "repo:tag", **build_options)`` builds
  an archive and pushes it, returning its ``ImageArchive``.

Nothing about the registry is faked: the agent's client meets the same answers,
errors and auth challenges a registry in a cluster gives.
"""

from __future__ import annotations

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
from sandlot.policy.registryaddress import RegistryAccess

LOOPBACK_ACCESS = RegistryAccess(private_hosts=frozenset(LOOPBACK_HOSTS))
"""What a puller of these registries (all on loopback) must be allowed."""

AUTH_USER = "puller"
AUTH_PASSWORD = "s3cret"


def _registry_fixture(
    tmp_path_factory: pytest.TempPathFactory, users: dict[str, str] | None
) -> Iterator[Registry]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    registry = start_registry(tmp_path_factory.mktemp("registry"), users=users)
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from _registry_fixture(tmp_path_factory, None)


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from _registry_fixture(tmp_path_factory, {AUTH_USER: AUTH_PASSWORD})


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
    "Registry",
    "StallingProxy",
    "auth_registry",
    "free_port",
    "push_image",
    "registry",
    "start_registry",
    "token_registry",
]


__all__ = [
    "AUTH_PASSWORD",
    "AUTH_USER",
    "Registry",
    "StallingProxy",
    "auth_registry",
    "free_port",
    "push_image",
    "registry",
    "start_registry",
]
