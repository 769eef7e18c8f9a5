"""A committed filesystem pushed to a real registry and started on another node.

A container writes a file, is committed in one containerd namespace (node A) and
pushed with ``adapters.pulling.push_image`` to the loopback registry behind htpasswd;
another namespace (node B, nothing of A's in its store) pulls that exact
reference under the local name and starts a container that sees the file. A
second push of the same state sends no blob (the registry has them all). Sealed
(``adapters.pulling.sealed``), the same state opens only with its owner's key.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import (
    ContainerdPuller,
    Credential,
    Endpoint,
    RegistryClient,
    RegistryError,
    push_image,
)
from sandlot.adapters.pulling.push import manifest_blobs
from sandlot.adapters.pulling.sealed import (
    KEY_BYTES,
    SEALED_BLOB,
    SEALED_MANIFEST,
    SealedPuller,
    SealError,
    push_sealed,
)
from sandlot.adapters.runtime import ContainerSpec, RuntimeTimeout
from sandlot.agent.teardown import teardown
from sandlot.policy.pulling import FailureKind, parse_reference
from sandlot.policy.suspension import suspended_image_name
from tests.integration.test_agent_node import CALL_TIMEOUT, IMAGE, KILL_WAIT
from tests.support import agents
from tests.support.containerd import PrivateContainerd, scratch_spec
from tests.support.containerd_fixtures import EVERY_CONTAINERD
from tests.support.registry import AUTH_PASSWORD, AUTH_USER, LOOPBACK_ACCESS, Registry
from tests.support.wait import wait_for

pytest_plugins = ["tests.support.registry"]
pytestmark = [pytest.mark.containerd, pytest.mark.integration, EVERY_CONTAINERD]


@pytest.fixture(scope="module")
def busybox_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


@pytest.fixture
def node_a(containerd: PrivateContainerd, busybox_archive: Path) -> Iterator[ContainerdRuntime]:
    with agents.containerd_namespace(containerd, "push-a", busybox_archive) as ns:
        runtime = ContainerdRuntime(containerd.address, ns)
        yield runtime
        runtime.close()


@pytest.fixture
def node_b(containerd: PrivateContainerd) -> Iterator[ContainerdRuntime]:
    with agents.containerd_namespace(containerd, "push-b") as ns:
        runtime = ContainerdRuntime(containerd.address, ns)
        yield runtime
        runtime.close()


def client_for(
    registry: Registry, repository: str, credential: Credential | None
) -> RegistryClient:
    return RegistryClient(
        Endpoint(f"http://{registry.host}"),
        repository,
        credential,
        connect_timeout=5,
        stall_timeout=5,
        deadline=Deadline(60, expired=RuntimeTimeout),
        access=LOOPBACK_ACCESS,
    )


def commit_written(rt: ContainerdRuntime, cid: str, image: str) -> None:
    spec = scratch_spec(["sh", "-c", "echo kept > /kept; sleep 1000"], "c", host_network=True)
    rt.create_container(ContainerSpec(id=cid, image=IMAGE, oci_spec=spec, labels={}), timeout=10)
    rt.start_task(cid, stdio="", timeout=10)
    wait_for(
        lambda: (Path(rt.writable_layer(cid, timeout=5)) / "kept").exists(),
        timeout=10,
        what="the file in the writable layer",
    )
    rt.pause_task(cid, timeout=5)
    rt.commit_container(cid, image, {}, timeout=30)
    teardown(rt, cid, kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)


def test_a_pushed_state_starts_on_another_node_with_its_files(
    containerd: PrivateContainerd,
    node_a: ContainerdRuntime,
    node_b: ContainerdRuntime,
    auth_registry: Registry,
) -> None:
    uid = uuid.uuid4().hex
    local = suspended_image_name(uid)
    commit_written(node_a, "commit-push", local)
    credential = Credential(AUTH_USER, AUTH_PASSWORD)
    manifest, media_type = node_a.image_manifest(local, timeout=10)

    def open_blob(digest: str) -> Iterator[bytes]:
        return node_a.open_blob(digest, timeout=30)

    with pytest.raises(RegistryError) as refused:  # no credential, no push
        push_image(client_for(auth_registry, "state/x", None), uid, manifest, media_type, open_blob)
    assert refused.value.kind is FailureKind.UNAUTHORIZED
    pushed = push_image(
        client_for(auth_registry, "state/x", credential), uid, manifest, media_type, open_blob
    )
    assert pushed.uploaded >= 2  # the base layer, the committed layer, the config
    assert pushed.reference == f"{auth_registry.host}/state/x:{uid}@{pushed.digest}"
    again = push_image(
        client_for(auth_registry, "state/x", credential), uid, manifest, media_type, open_blob
    )
    assert (again.digest, again.uploaded) == (pushed.digest, 0), again

    puller = ContainerdPuller(
        containerd.address,
        node_b.namespace,
        stall_timeout=5.0,
        transfer=False,
        access=LOOPBACK_ACCESS,
    )
    try:
        puller.pull(
            local,
            parse_reference(pushed.reference),
            [Endpoint(f"http://{auth_registry.host}")],
            credential,
            deadline=60,
            labels={},
        )
    finally:
        puller.close()
    spec = scratch_spec(["sleep", "1000"], "c", host_network=True)
    node_b.create_container(
        ContainerSpec(id="moved", image=local, oci_spec=spec, labels={}), timeout=10
    )
    node_b.start_task("moved", stdio="", timeout=10)
    try:
        task = node_b.get_task("moved", timeout=5)
        assert task is not None
        assert Path(f"/proc/{task.pid}/root/kept").read_text() == "kept\n"
    finally:
        teardown(node_b, "moved", kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)


def test_a_push_behind_bearer_tokens_asks_for_push_after_pull(
    node_a: ContainerdRuntime, token_registry: Registry
) -> None:
    """The blob checks get a pull token; the upload's challenge names push as well,
    and a second token (with it) is asked for instead of giving up."""
    uid = uuid.uuid4().hex
    local = suspended_image_name(uid)
    commit_written(node_a, "commit-token", local)
    manifest, media_type = node_a.image_manifest(local, timeout=10)

    def open_blob(digest: str) -> Iterator[bytes]:
        return node_a.open_blob(digest, timeout=30)

    credential = Credential(AUTH_USER, AUTH_PASSWORD)
    pushed = push_image(
        client_for(token_registry, "state/t", credential), uid, manifest, media_type, open_blob
    )
    assert pushed.uploaded >= 2
    reader = client_for(token_registry, "state/t", credential)
    try:
        reader.manifest_exists(pushed.digest)
    finally:
        reader.close()


def test_sealed_state_opens_on_the_node_given_its_key_and_nowhere_else(
    containerd: PrivateContainerd,
    node_a: ContainerdRuntime,
    node_b: ContainerdRuntime,
    auth_registry: Registry,
) -> None:
    """What every node's registry credential reads of a sealed state is ciphertext
    and a sealed manifest; another key opens nothing and leaves nothing in the
    node's store; the owner's key starts it with its files."""
    uid = uuid.uuid4().hex
    local = suspended_image_name(uid)
    commit_written(node_a, "commit-sealed", local)
    manifest, media_type = node_a.image_manifest(local, timeout=10)
    key, other = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
    credential = Credential(AUTH_USER, AUTH_PASSWORD)

    def open_blob(digest: str) -> Iterator[bytes]:
        return node_a.open_blob(digest, timeout=30)

    client = client_for(auth_registry, "state/sealed", credential)
    pushed = push_sealed(client, uid, manifest, media_type, open_blob, key)
    again = push_sealed(client, uid, manifest, media_type, open_blob, key)
    assert (again.digest, again.uploaded) == (pushed.digest, 0), "sealing is not deterministic"
    stored, _ = client.manifest(pushed.digest)
    wrapper = json.loads(stored)
    assert wrapper["config"]["mediaType"] == SEALED_MANIFEST
    plain = {d for d, _ in manifest_blobs(json.loads(manifest))}
    for layer in wrapper["layers"]:
        assert layer["mediaType"] == SEALED_BLOB and layer["digest"] not in plain
        sealed = b"".join(client.blob(layer["digest"]))
        assert b"kept\n" not in sealed and b"diff_ids" not in sealed
    client.close()

    puller = SealedPuller(
        containerd.address,
        node_b.namespace,
        stall_timeout=5.0,
        transfer=False,
        access=LOOPBACK_ACCESS,
    )
    endpoints = [Endpoint(f"http://{auth_registry.host}")]
    ref = parse_reference(pushed.reference)
    try:
        with pytest.raises(SealError, match="cannot be opened with this key"):
            puller.pull_sealed(local, ref, endpoints, credential, other, deadline=60)
        assert not puller.has_image(local, timeout=5), "an unopened state left an image"
        puller.pull_sealed(local, ref, endpoints, credential, key, deadline=60)
    finally:
        puller.close()
    spec = scratch_spec(["sleep", "1000"], "c", host_network=True)
    node_b.create_container(
        ContainerSpec(id="opened", image=local, oci_spec=spec, labels={}), timeout=10
    )
    node_b.start_task("opened", stdio="", timeout=10)
    try:
        task = node_b.get_task("opened", timeout=5)
        assert task is not None
        assert Path(f"/proc/{task.pid}/root/kept").read_text() == "kept\n"
    finally:
        teardown(node_b, "opened", kill_wait=KILL_WAIT, call_timeout=CALL_TIMEOUT)
