"""The pull path a daemon gets, on every containerd line, against a real registry
(docker-registry on loopback, images pushed with skopeo): containerd 2.x pulls
through its Transfer service (progress and credentials on Streaming service
streams), 1.6 client-side; both land the same record, unpacked, labelled, and
runnable. The client-side path's own details are in ``test_image_pull.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import (
    ContainerdPuller,
    Credential,
    Endpoint,
    PullMethod,
    RegistryError,
)
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout
from sandlot.api.keys import LAST_USED_LABEL
from sandlot.policy.pulling import FailureKind, parse_reference
from tests.integration.test_image_pull import SLACK, _pull, _run
from tests.support.containerd import (
    PrivateContainerd,
    start_private_containerd,
    unavailable_reason,
)
from tests.support.containerd_fixtures import EVERY_CONTAINERD, LINE_2, LINE_OS
from tests.support.registry import (
    AUTH_PASSWORD,
    AUTH_USER,
    LOOPBACK_ACCESS,
    Registry,
    StallingProxy,
    scripted_server,
)

pytestmark = [pytest.mark.containerd, pytest.mark.integration, EVERY_CONTAINERD]


@pytest.fixture
def puller(containerd: PrivateContainerd) -> Iterator[ContainerdPuller]:
    p = ContainerdPuller(
        containerd.address, containerd.namespace, stall_timeout=2.0, access=LOOPBACK_ACCESS
    )
    try:
        yield p
    finally:
        p.close()


def _expected(containerd: PrivateContainerd) -> PullMethod:
    return PullMethod.TRANSFER if containerd.line == LINE_2 else PullMethod.CLIENT_SIDE


def _method(puller: ContainerdPuller, ref: str, endpoints: list[Endpoint] | None = None) -> str:
    parsed = parse_reference(ref)
    chosen = puller.method(
        parsed,
        endpoints or [Endpoint(f"http://{parsed.registry}")],
        Deadline(10, expired=RuntimeTimeout),
    )
    return str(chosen)


def test_pull_path_follows_what_the_daemon_offers(
    containerd: PrivateContainerd, puller: ContainerdPuller, registry: Registry
) -> None:
    ref = registry.ref("pull/choice:1")
    assert _method(puller, ref) == _expected(containerd)
    # A mirror from the agent's hosts.toml directory is the agent's to use.
    mirrored = [Endpoint("http://127.0.0.1:1"), Endpoint(f"http://{registry.host}")]
    assert _method(puller, ref, mirrored) == PullMethod.CLIENT_SIDE


def test_public_image_pulls_with_progress_unpacked_labelled_and_runs(
    containerd: PrivateContainerd,
    puller: ContainerdPuller,
    runtime: ContainerdRuntime,
    registry: Registry,
    push_image: Any,
    tmp_path: Path,
) -> None:
    pushed = push_image(
        registry,
        f"pull/path-{containerd.line}:1",
        extra_files={"/hello": b"pulled\n"},
        filler_bytes=2 * 1024 * 1024,
    )
    assert _method(puller, pushed.name) == _expected(containerd)
    seen: list[tuple[int, int]] = []

    result = _pull(puller, pushed.name, progress=lambda done, total: seen.append((done, total)))

    assert result.digest == pushed.manifest_digest
    assert result.total_bytes > 2 * 1024 * 1024  # config and layers, the filler's among them
    assert seen, "no progress was reported"
    assert seen[-1][0] == seen[-1][1] == result.total_bytes
    # The filler layer is new to the node; the busybox one may be there already.
    assert 2 * 1024 * 1024 <= result.fetched_bytes <= result.total_bytes
    record = next(r for r in runtime.list_images(timeout=10) if r.name == pushed.name)
    assert record.target_digest == pushed.manifest_digest
    assert record.labels[LAST_USED_LABEL] == "2026-01-01T00:00:00Z"
    assert _run(runtime, pushed.name, tmp_path) == "pulled\n"


def test_protected_image_pulls_with_its_credential(
    containerd: PrivateContainerd,
    puller: ContainerdPuller,
    runtime: ContainerdRuntime,
    auth_registry: Registry,
    push_image: Any,
    tmp_path: Path,
) -> None:
    pushed = push_image(
        auth_registry, f"pull/path-private-{containerd.line}:1", extra_files={"/hello": b"ok\n"}
    )
    assert _method(puller, pushed.name) == _expected(containerd)

    result = _pull(puller, pushed.name, credential=Credential(AUTH_USER, AUTH_PASSWORD))

    assert result.digest == pushed.manifest_digest
    assert _run(runtime, pushed.name, tmp_path) == "ok\n"


@pytest.mark.parametrize(
    "credential",
    [None, Credential(AUTH_USER, "wrong")],
    ids=["no-credential", "wrong-password"],
)
def test_refused_credential_is_unauthorized(
    containerd: PrivateContainerd,
    puller: ContainerdPuller,
    auth_registry: Registry,
    push_image: Any,
    credential: Credential | None,
) -> None:
    pushed = push_image(auth_registry, f"pull/path-refused-{containerd.line}:1", salt="refused")
    with pytest.raises(RegistryError) as caught:
        _pull(puller, pushed.name, credential=credential)
    assert caught.value.kind is FailureKind.UNAUTHORIZED, str(caught.value)
    assert not puller.has_image(pushed.name, timeout=10)


def test_missing_tag_is_not_found(
    containerd: PrivateContainerd, puller: ContainerdPuller, registry: Registry, push_image: Any
) -> None:
    push_image(registry, f"pull/path-tagged-{containerd.line}:exists", salt="tagged")
    with pytest.raises(RegistryError) as caught:
        _pull(puller, registry.ref(f"pull/path-tagged-{containerd.line}:absent"))
    assert caught.value.kind is FailureKind.NOT_FOUND, str(caught.value)


def test_registry_stalling_mid_blob_fails_within_the_stall_timeout(
    containerd: PrivateContainerd, puller: ContainerdPuller, registry: Registry, push_image: Any
) -> None:
    """The stalling registry is the one the reference names (no mirror), so a daemon
    with the Transfer service pulls, and the stall is seen on its progress stream."""
    repo_tag = f"pull/path-stall-{containerd.line}:1"
    push_image(registry, repo_tag, salt="stall", filler_bytes=4 * 1024 * 1024)
    proxy = StallingProxy(registry.port, stall_after=256 * 1024)
    ref = f"{proxy.host}/{repo_tag}"
    try:
        assert _method(puller, ref) == _expected(containerd)
        started = time.monotonic()
        with pytest.raises(RegistryError) as caught:
            _pull(puller, ref, deadline=60)
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert caught.value.kind is FailureKind.TRANSIENT
    assert "stalled" in str(caught.value)
    assert elapsed < puller.stall_timeout + SLACK, f"stall took {elapsed:.1f}s to detect"
    assert not puller.has_image(ref, timeout=10)


def test_pull_deadline_bounds_a_pull_whose_stall_timeout_is_longer(
    containerd: PrivateContainerd, registry: Registry, push_image: Any
) -> None:
    repo_tag = f"pull/path-deadline-{containerd.line}:1"
    push_image(registry, repo_tag, salt="deadline", filler_bytes=1024 * 1024)
    proxy = StallingProxy(registry.port, stall_after=64 * 1024)
    slow = ContainerdPuller(
        containerd.address, containerd.namespace, stall_timeout=30.0, access=LOOPBACK_ACCESS
    )
    ref = f"{proxy.host}/{repo_tag}"
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError_) as caught:
            _pull(slow, ref, deadline=2.0)
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
        slow.close()
    assert "deadline of 2s passed" in str(caught.value)
    assert elapsed < 2.0 + SLACK, f"a 2 s pull deadline took {elapsed:.1f}s"


@pytest.mark.parametrize(
    ("first", "then"),
    [(LINE_2, LINE_OS), (LINE_OS, LINE_2)],
    ids=["2.x-replaced-by-1.6", "1.6-replaced-by-2.x"],
)
def test_a_daemon_replaced_on_the_same_socket_is_asked_again(
    first: str,
    then: str,
    registry: Registry,
    push_image: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A node's containerd upgraded or downgraded under a running agent. A pull
    that meets a daemon without the Transfer service pulls client-side at once and
    the puller asks again; a daemon that gained the service keeps being served
    client-side, which it serves too."""
    for line in (first, then):
        reason = unavailable_reason(line)
        if reason is not None:
            pytest.skip(reason)
    pushed = push_image(registry, f"pull/path-replaced-{first}:1", salt=f"replaced-{first}")
    daemon = start_private_containerd(line=first)
    puller = ContainerdPuller(
        daemon.address, daemon.namespace, stall_timeout=5.0, access=LOOPBACK_ACCESS
    )
    try:
        expected_first = PullMethod.TRANSFER if first == LINE_2 else PullMethod.CLIENT_SIDE
        assert _method(puller, pushed.name) == expected_first
        daemon.stop()
        daemon.remove()
        daemon = PrivateContainerd(daemon.root_dir, line=then)
        daemon.root_dir.mkdir()
        daemon.start()

        result = _pull(puller, pushed.name)

        assert result.digest == pushed.manifest_digest
        expected_then = PullMethod.TRANSFER if then == LINE_2 else PullMethod.CLIENT_SIDE
        if then == LINE_OS:  # the failed Transfer call made the puller ask again
            assert _method(puller, pushed.name) == expected_then
        assert puller.has_image(pushed.name, timeout=10)
    finally:
        puller.close()
        daemon.stop()
        daemon.remove()


def test_the_daemon_follows_a_redirect_off_the_registry_itself(
    containerd: PrivateContainerd, puller: ContainerdPuller
) -> None:
    """Why the agent pulls client-side unless ``image_pull_by_daemon`` is set: on the
    Transfer path containerd 2.x follows a registry's redirect to another host inside
    the daemon, where the agent's limits never see it. The client-side path (1.6)
    refuses it before any request there. Both hosts are on loopback."""
    seen: list[str] = []

    def elsewhere_answer(method: str, path: str, headers: dict[str, str]) -> Any:
        seen.append(path)
        return 404, {}, b""

    with scripted_server(elsewhere_answer) as elsewhere:
        target = f"http://localhost:{elsewhere.port}/elsewhere"

        def front_answer(method: str, path: str, headers: dict[str, str]) -> Any:
            return 307, {"Location": target}, b""

        with scripted_server(front_answer) as front:
            ref = f"{front.host}/redir/daemon:1"
            parsed = parse_reference(ref)
            with pytest.raises((RegistryError, RuntimeError_)):
                puller.pull(
                    ref,
                    parsed,
                    [Endpoint(f"http://{parsed.registry}")],
                    None,
                    deadline=30,
                    labels={},
                )
    if containerd.line == LINE_2:
        assert seen, "containerd 2.x did not follow the redirect on the Transfer path"
    else:
        assert seen == []
