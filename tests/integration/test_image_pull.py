"""The client-side pull against a real registry (docker-registry on loopback, images
pushed with skopeo) into a real containerd, on every containerd line (2.x serves
the client-side path too; the choice of path is ``test_image_pull_transfer.py``'s):
content, unpack, record, and the failures a registry gives (a refused credential,
a missing tag, a stall mid-blob).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.pulling import ContainerdPuller, Credential, Endpoint, RegistryError
from sandlot.adapters.runtime import ContainerSpec, RuntimeError_
from sandlot.agent.imagegc import ImageCollector
from sandlot.agent.pulling import ImageGate, ImagePulls, PullMetrics, PullOptions, PullRefused
from sandlot.api.keys import LAST_USED_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.imagegc import DiskUsage, GcThresholds
from sandlot.policy.pulling import FailureKind, RegistryAccess, parse_reference
from sandlot.policy.snapshots import SNAPSHOT_IMAGE_LABEL, snapshot_image_name
from tests.support.containerd import PrivateContainerd, scratch_spec
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.registry import (
    AUTH_PASSWORD,
    AUTH_USER,
    LOOPBACK_ACCESS,
    Registry,
    StallingProxy,
    scripted_server,
)

pytestmark = [pytest.mark.containerd, pytest.mark.integration, EVERY_CONTAINERD]

SLACK = 3.0  # seconds beyond a bound allowed for a busy machine


@pytest.fixture
def puller(containerd: PrivateContainerd) -> Iterator[ContainerdPuller]:
    p = ContainerdPuller(
        containerd.address,
        containerd.namespace,
        stall_timeout=2.0,
        transfer=False,
        access=LOOPBACK_ACCESS,
    )
    try:
        yield p
    finally:
        p.close()


def _pull(
    puller: ContainerdPuller,
    ref: str,
    *,
    credential: Credential | None = None,
    host: str | None = None,
    deadline: float = 60.0,
    progress: Any = None,
) -> Any:
    parsed = parse_reference(ref)
    endpoint = Endpoint(f"http://{host or parsed.registry}")
    return puller.pull(
        ref,
        parsed,
        [endpoint],
        credential,
        deadline=deadline,
        labels={LAST_USED_LABEL: "2026-01-01T00:00:00Z"},
        progress=progress,
    )


def _run(runtime: ContainerdRuntime, image: str, tmp_path: Path) -> str:
    """Create and start a container from ``image``; its output once it exited."""
    container_id = f"pulled-{uuid.uuid4().hex[:8]}"
    spec = scratch_spec(["sh", "-c", "cat /hello"], container_id, host_network=False)
    log_path = tmp_path / f"{container_id}.log"
    runtime.create_container(ContainerSpec(id=container_id, image=image, oci_spec=spec), timeout=10)
    try:
        runtime.start_task(container_id, stdio=f"file://{log_path}", timeout=10)
        runtime.wait_task(container_id, timeout=10)
        return log_path.read_text()
    finally:
        steps: list[Callable[[], object]] = [
            lambda: runtime.kill_task(container_id, signal.SIGKILL, timeout=3),
            lambda: runtime.delete_task(container_id, timeout=5),
            lambda: runtime.delete_container(container_id, timeout=5),
            lambda: runtime.remove_snapshot(container_id, timeout=5),
        ]
        for step in steps:
            with contextlib.suppress(RuntimeError_):
                step()


@pytest.mark.parametrize("compress", [False, True], ids=["plain-layers", "gzip-layers"])
def test_pulled_image_is_unpacked_labelled_and_runs(
    puller: ContainerdPuller,
    runtime: ContainerdRuntime,
    registry: Registry,
    push_image: Any,
    tmp_path: Path,
    compress: bool,
) -> None:
    tag = f"pull/public:{'gz' if compress else 'tar'}"
    pushed = push_image(registry, tag, extra_files={"/hello": b"pulled\n"}, compress=compress)
    seen: list[tuple[int, int]] = []

    result = _pull(puller, pushed.name, progress=lambda done, total: seen.append((done, total)))

    assert result.digest == pushed.manifest_digest
    assert seen and seen[-1][0] == seen[-1][1] == result.total_bytes > 0
    record = next(r for r in runtime.list_images(timeout=10) if r.name == pushed.name)
    assert record.target_digest == pushed.manifest_digest
    assert record.labels[LAST_USED_LABEL] == "2026-01-01T00:00:00Z"
    assert _run(runtime, pushed.name, tmp_path) == "pulled\n"


def test_second_pull_of_present_layers_fetches_only_what_is_new(
    puller: ContainerdPuller, registry: Registry, push_image: Any
) -> None:
    first = push_image(registry, "pull/shared:1", salt="one")
    second = push_image(registry, "pull/shared:2", salt="two")
    _pull(puller, first.name)
    again = _pull(puller, second.name)
    # The busybox layer is shared: only the salt layer and the config travel.
    assert 0 < again.fetched_bytes < again.total_bytes


def test_moved_tag_is_pulled_again_and_the_record_follows_it(
    puller: ContainerdPuller,
    runtime: ContainerdRuntime,
    registry: Registry,
    push_image: Any,
    tmp_path: Path,
) -> None:
    before = push_image(registry, "pull/moving:v", extra_files={"/hello": b"before\n"})
    _pull(puller, before.name)
    after = push_image(registry, "pull/moving:v", extra_files={"/hello": b"after\n"})
    assert after.manifest_digest != before.manifest_digest

    _pull(puller, after.name)

    record = next(r for r in runtime.list_images(timeout=10) if r.name == after.name)
    assert record.target_digest == after.manifest_digest
    assert _run(runtime, after.name, tmp_path) == "after\n"


def test_protected_image_pulls_with_its_credential(
    puller: ContainerdPuller, auth_registry: Registry, push_image: Any
) -> None:
    pushed = push_image(auth_registry, "pull/private:1", salt="private")
    result = _pull(puller, pushed.name, credential=Credential(AUTH_USER, AUTH_PASSWORD))
    assert result.digest == pushed.manifest_digest
    assert puller.has_image(pushed.name, timeout=10)


@pytest.mark.parametrize(
    "credential",
    [None, Credential(AUTH_USER, "wrong")],
    ids=["no-credential", "wrong-password"],
)
def test_refused_credential_is_unauthorized_with_its_error_code(
    puller: ContainerdPuller,
    auth_registry: Registry,
    push_image: Any,
    credential: Credential | None,
) -> None:
    pushed = push_image(auth_registry, "pull/refused:1", salt="refused")
    with pytest.raises(RegistryError) as caught:
        _pull(puller, pushed.name, credential=credential)
    assert caught.value.kind is FailureKind.UNAUTHORIZED
    assert "UNAUTHORIZED" in str(caught.value)
    assert not puller.has_image(pushed.name, timeout=10)


def test_missing_tag_is_not_found_with_its_error_code(
    puller: ContainerdPuller, registry: Registry, push_image: Any
) -> None:
    push_image(registry, "pull/tagged:exists", salt="tagged")
    with pytest.raises(RegistryError) as caught:
        _pull(puller, registry.ref("pull/tagged:absent"))
    assert caught.value.kind is FailureKind.NOT_FOUND
    assert "MANIFEST_UNKNOWN" in str(caught.value)


def test_registry_stalling_mid_blob_fails_within_the_stall_timeout(
    puller: ContainerdPuller, registry: Registry, push_image: Any
) -> None:
    pushed = push_image(registry, "pull/stall:1", salt="stall", filler_bytes=4 * 1024 * 1024)
    proxy = StallingProxy(registry.port, stall_after=256 * 1024)
    try:
        started = time.monotonic()
        with pytest.raises(RegistryError) as caught:
            _pull(puller, pushed.name, host=proxy.host, deadline=60)
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert caught.value.kind is FailureKind.TRANSIENT
    assert "stalled" in str(caught.value)
    assert elapsed < puller.stall_timeout + SLACK, f"stall took {elapsed:.1f}s to detect"
    assert not puller.has_image(pushed.name, timeout=10)


def test_pull_deadline_bounds_a_pull_whose_stall_timeout_is_longer(
    containerd: PrivateContainerd, registry: Registry, push_image: Any
) -> None:
    pushed = push_image(registry, "pull/deadline:1", salt="deadline", filler_bytes=1024 * 1024)
    proxy = StallingProxy(registry.port, stall_after=64 * 1024)
    slow = ContainerdPuller(
        containerd.address, containerd.namespace, stall_timeout=30.0, access=LOOPBACK_ACCESS
    )
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError_) as caught:
            _pull(slow, pushed.name, host=proxy.host, deadline=2.0)
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
        slow.close()
    assert "deadline of 2s passed" in str(caught.value)
    assert elapsed < 2.0 + SLACK, f"a 2 s pull deadline took {elapsed:.1f}s"


def test_collector_never_evicts_an_image_a_start_holds(
    containerd: PrivateContainerd, registry: Registry, push_image: Any
) -> None:
    """A forced pass (it evicts every unprotected image, pressure or not) while a
    start holds the image it pulled, before any container exists: the image stays.
    Once the start lets go, the same pass takes it. Its own containerd namespace:
    a forced pass takes everything unprotected."""
    pushed = push_image(registry, "pull/held:1", salt="held")
    namespace = f"held-{uuid.uuid4().hex[:8]}"
    rt = ContainerdRuntime(containerd.address, namespace)
    puller = ContainerdPuller(containerd.address, namespace, access=LOOPBACK_ACCESS)
    pulls = ImagePulls(
        lambda: puller,
        lambda ref: [Endpoint(f"http://{ref.registry}")],
        PullOptions(deadline=60, call_timeout=10),
        threading.Event(),
        PullMetrics(CollectorRegistry()),
        lambda: datetime.now(UTC),
    )
    collector = ImageCollector(
        rt,
        lambda: DiskUsage(total_bytes=100, used_bytes=10),
        GcThresholds(min_age=timedelta(0)),
        call_timeout=10,
        starting=pulls.starting,
    )
    try:
        with pulls.hold(pushed.name):
            _pull(puller, pushed.name)
            held = collector.run_forced(now=datetime.now(UTC))
            assert pushed.name not in held.removed
            assert puller.has_image(pushed.name, timeout=10)
        released = collector.run_forced(now=datetime.now(UTC))
        assert pushed.name in released.removed
        assert not puller.has_image(pushed.name, timeout=10)
    finally:
        pulls.close()
        puller.close()
        rt.close()


@pytest.mark.parametrize(
    "credential",
    [None, Credential(AUTH_USER, AUTH_PASSWORD)],
    ids=["anonymous-token", "token-for-a-credential"],
)
def test_bearer_token_registry_pulls_with_a_token_from_its_realm(
    puller: ContainerdPuller,
    token_registry: Registry,
    push_image: Any,
    credential: Credential | None,
) -> None:
    pushed = push_image(token_registry, "pull/token:1", salt="token")
    issued = token_registry.token_server.issued if token_registry.token_server else 0

    result = _pull(puller, pushed.name, credential=credential)

    assert result.digest == pushed.manifest_digest
    assert token_registry.token_server is not None
    assert token_registry.token_server.issued > issued  # the registry's challenge was answered


def test_bearer_token_realm_refusing_the_credential_is_unauthorized(
    puller: ContainerdPuller, token_registry: Registry, push_image: Any
) -> None:
    pushed = push_image(token_registry, "pull/token-refused:1", salt="token-refused")
    with pytest.raises(RegistryError) as caught:
        _pull(puller, pushed.name, credential=Credential(AUTH_USER, "wrong"))
    assert caught.value.kind is FailureKind.UNAUTHORIZED
    # The realm's own words ({"details": "wrong credential"}) never reach a message.
    assert "HTTP 401 Unauthorized" in str(caught.value)
    assert "wrong credential" not in str(caught.value)


# ---------------------------------------------------------------- where requests may go

NOT_FOUND_WITH_WORDS = (
    404,
    {"Content-Type": "application/json"},
    b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"secret words of the registry"}]}',
)


def _redirect_to(location: str) -> Any:
    def answer(method: str, path: str, headers: dict[str, str]) -> Any:
        return 307, {"Location": location}, b""

    return answer


def _puller_with(containerd: PrivateContainerd, access: RegistryAccess) -> ContainerdPuller:
    return ContainerdPuller(
        containerd.address, containerd.namespace, stall_timeout=5.0, transfer=False, access=access
    )


def test_a_redirect_to_another_host_is_refused_before_any_request_there(
    puller: ContainerdPuller,
) -> None:
    with (
        scripted_server(lambda *_: NOT_FOUND_WITH_WORDS) as elsewhere,
        scripted_server(_redirect_to(f"http://localhost:{elsewhere.port}/blob")) as front,
    ):
        with pytest.raises(RegistryError) as caught:
            _pull(puller, f"{front.host}/redir/away:1")
        assert "registry_redirect_hosts" in str(caught.value)
        assert elsewhere.requests == []


def test_a_redirect_to_a_listed_host_is_followed_without_the_credential(
    containerd: PrivateContainerd,
) -> None:
    """The registry wants Basic auth, then redirects to its (listed) storage host: the
    storage sees no credential, and its error text stays out of the message."""

    def registry(method: str, path: str, headers: dict[str, str]) -> Any:
        if "Authorization" not in headers:
            return 401, {"WWW-Authenticate": 'Basic realm="r"'}, b""
        return 307, {"Location": f"http://localhost:{storage.port}/blob"}, b""

    with (
        scripted_server(lambda *_: NOT_FOUND_WITH_WORDS) as storage,
        scripted_server(registry) as front,
    ):
        access = replace(LOOPBACK_ACCESS, redirect_hosts=frozenset({f"localhost:{storage.port}"}))
        listed = _puller_with(containerd, access)
        try:
            with pytest.raises(RegistryError) as caught:
                _pull(listed, f"{front.host}/redir/listed:1", credential=Credential("u", "p"))
        finally:
            listed.close()
        assert caught.value.kind is FailureKind.NOT_FOUND, caught.value
        assert "HTTP 404 Not Found (MANIFEST_UNKNOWN)" in str(caught.value)
        assert "secret words" not in str(caught.value)
        assert storage.requests and all("Authorization" not in h for _, _, h in storage.requests)


def test_redirects_stop_after_five_hops(puller: ContainerdPuller) -> None:
    def loop(method: str, path: str, headers: dict[str, str]) -> Any:
        return 307, {"Location": f"{path}x"}, b""

    with scripted_server(loop) as front:
        with pytest.raises(RegistryError) as caught:
            _pull(puller, f"{front.host}/redir/loop:1")
        assert "more than 5 redirects" in str(caught.value)
        assert len(front.requests) == 6


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted-realm", "listed-realm"])
def test_a_token_realm_at_a_private_address_is_used_only_when_listed(
    containerd: PrivateContainerd, listed: bool
) -> None:
    """The realm is on 127.0.0.2 (loopback: nothing leaves the machine); only the
    registry's own 127.0.0.1 is listed, unless the test lists the realm's host too."""

    def realm(method: str, path: str, headers: dict[str, str]) -> Any:
        return 200, {"Content-Type": "application/json"}, b'{"token":"t"}'

    def registry(method: str, path: str, headers: dict[str, str]) -> Any:
        if headers.get("Authorization") != "Bearer t":
            challenge = f'Bearer realm="http://127.0.0.2:{tokens.port}/token",service="s"'
            return 401, {"WWW-Authenticate": challenge}, b""
        return NOT_FOUND_WITH_WORDS

    with (
        scripted_server(realm, address="127.0.0.2") as tokens,
        scripted_server(registry) as front,
    ):
        hosts = LOOPBACK_ACCESS.private_hosts | ({"127.0.0.2"} if listed else set())
        guarded = _puller_with(containerd, replace(LOOPBACK_ACCESS, private_hosts=hosts))
        try:
            with pytest.raises(RegistryError) as caught:
                _pull(guarded, f"{front.host}/realm/x:1")
        finally:
            guarded.close()
    if listed:
        assert len(tokens.requests) == 1
        assert caught.value.kind is FailureKind.NOT_FOUND, caught.value
    else:
        assert tokens.requests == []
        assert "registry_private_hosts" in str(caught.value)


def test_a_committed_image_starts_only_for_a_sandbox_of_its_namespace(
    puller: ContainerdPuller, runtime: ContainerdRuntime, registry: Registry, push_image: Any
) -> None:
    """The start step of a fork or a restore (``ImageGate.check`` with the committed
    image) reads the image's owner label from containerd: another namespace's
    snapshot is refused, the sandbox's own goes on without a pull."""
    pushed = push_image(registry, "pull/committed:1", salt="committed")
    _pull(puller, pushed.name)
    committed = snapshot_image_name(uuid.uuid4().hex)
    runtime.copy_image(
        pushed.name, committed, {SNAPSHOT_IMAGE_LABEL: "team-a.prepared"}, timeout=30
    )
    pulls = ImagePulls(
        lambda: puller,
        lambda ref: [Endpoint(f"http://{ref.registry}")],
        PullOptions(deadline=60, call_timeout=10),
        threading.Event(),
        PullMetrics(CollectorRegistry()),
        lambda: datetime.now(UTC),
    )
    gate = ImageGate(pulls, status=None, credentials=None)  # type: ignore[arg-type]
    spec = SandboxSpec(image=pushed.name)

    def sandbox(namespace: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": "fork", "uid": "u-1"}}

    try:
        gate.check(sandbox("team-a"), spec, committed)  # its own: goes on
        with pytest.raises(PullRefused) as caught:
            gate.check(sandbox("team-b"), spec, committed)
        assert caught.value.reason == SandboxReason.INVALID_IMAGE_NAME
        assert "team-a" in str(caught.value) and "team-b" in str(caught.value)
        assert pulls.starting() == frozenset(), "a committed image is never pulled"
    finally:
        pulls.close()
