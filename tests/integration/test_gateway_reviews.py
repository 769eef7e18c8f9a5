"""The gateway's remembered access reviews, against the real API server's RBAC: a
program's commands one after another are reviewed once per ``review_cache_ttl``, a
revoked permission is refused within that bound, and a denied caller is asked about
every time (a permission granted after a refusal works at once). The rig is
``tests/support/streams.py``'s, its gateway here with a TTL of its own; commands go
as the SDK sends them (``adapters.streamclient``), each caller with its own token."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.streamclient import StreamRefused, open_stream
from sandlot.agent.main import Agent
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.gatewayrig import running_gateway
from sandlot.devtools.streamnet import StreamAddress
from sandlot.gateway.runner import GatewayParts
from sandlot.policy.streams import EXEC, STATUS, StreamRequest, api_path, decode_frame, end_of
from tests.support.streams import (
    EDIT,
    GET_ONLY,
    StartStreamAgent,
    _grant,
    _user_kubeconfig,
    delete_sandbox,
    running_sandbox,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

TTL = 10.0  # the gateway's review_cache_ttl here
# RBAC changes reach the API server's authorizer through its informers: well under
# a second on the rig; the bound below leaves room for a loaded run.
PROPAGATION = 5.0
REVIEWS = "sandlot_gateway_access_reviews_total"


@pytest.fixture(scope="module")
def gateway(
    kube: client.ApiClient,
    places: tuple[str, str],
    stream_address: StreamAddress,
    stream_certs: StreamCerts,
) -> Iterator[GatewayParts]:
    """The rig's gateway (as tests/support/streams.py's) keeping allows ``TTL``."""
    system, _ = places
    with running_gateway(
        kube,
        stream_certs,
        system,
        stream_address.ip,
        call_timeout="30s",
        review_cache_ttl=f"{TTL:g}s",
    ) as parts:
        yield parts


@pytest.fixture(scope="module")
def agent(start_stream_agent: StartStreamAgent) -> Agent:
    return start_stream_agent("reviews", handshake_timeout=30.0)


def reviews(gateway: GatewayParts, source: str) -> float:
    return gateway.registry.get_sample_value(REVIEWS, {"source": source}) or 0.0


def run_true(api: client.ApiClient, namespace: str, name: str) -> int | str:
    """``true`` in the sandbox as the SDK runs it: its exit code, or the refusal's
    ``status: message``."""
    path = api_path(StreamRequest(EXEC, namespace, name, command=("true",)))
    try:
        stream = open_stream(api, path)
    except StreamRefused as e:
        return f"{e.status}: {e}"
    status = None
    try:
        while (message := stream.recv(timeout=30)) is not None:
            channel, data = decode_frame(message)
            if channel == STATUS:
                status = data
    finally:
        stream.close()
    return end_of(status).exit_code


def caller(
    kube: client.ApiClient,
    plane: ControlPlane,
    tenant: str,
    workdir: Path,
    rules: list[dict[str, Any]],
) -> tuple[str, client.ApiClient]:
    """A new ServiceAccount of ``tenant`` granted ``rules``: (its name, its client)."""
    name = f"caller-{uuid.uuid4().hex[:6]}"
    config = _user_kubeconfig(kube, plane, tenant, name, workdir)
    _grant(kube, tenant, f"{name}-sandboxes", rules, (tenant, name))
    return name, load_api_client(str(config))


def test_a_revoked_permission_is_refused_within_the_review_cache_ttl(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    gateway: GatewayParts,
    agent: Agent,
    places: tuple[str, str],
    tmp_path: Path,
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "revoked", "sleep 1000")
    name, api = caller(kube, control_plane, tenant, tmp_path, EDIT)
    try:
        wait_for(
            lambda: run_true(api, tenant, "revoked") == 0,
            timeout=PROPAGATION,
            what="the granted caller's first command to run",
        )
        asked, kept = reviews(gateway, "api"), reviews(gateway, "cache")
        # Right after the first, within TTL of its review: not asked again.
        assert run_true(api, tenant, "revoked") == 0
        assert reviews(gateway, "cache") - kept == 1, "the second command was reviewed again"
        assert reviews(gateway, "api") == asked, "the second command's review was asked"
        rbac = client.RbacAuthorizationV1Api(kube)
        rbac.delete_namespaced_role_binding(f"{name}-sandboxes", tenant)
        revoked = time.monotonic()
        answers: list[int | str] = []

        def refused() -> bool:
            answers.append(run_true(api, tenant, "revoked"))
            return isinstance(answers[-1], str)

        wait_for(
            refused,
            timeout=TTL + PROPAGATION,
            what=f"the revoked caller to be refused within the TTL ({TTL:g}s)",
        )
        took = time.monotonic() - revoked
        assert "403" in str(answers[-1]), answers[-1]
        assert took < TTL + PROPAGATION, (took, answers)
    finally:
        api.close()
        delete_sandbox(kube, tenant, "revoked")


def test_a_denied_caller_is_never_answered_from_the_cache(
    kube: client.ApiClient,
    control_plane: ControlPlane,
    gateway: GatewayParts,
    agent: Agent,
    places: tuple[str, str],
    tmp_path: Path,
) -> None:
    """The caller passes the API server's own check (get) but the gateway asks for
    create: refused by the gateway's review, each time asked again; granted create,
    its next command runs, long before a kept denial would have expired."""
    _, tenant = places
    running_sandbox(kube, agent, tenant, "denied", "sleep 1000")
    name, api = caller(kube, control_plane, tenant, tmp_path, GET_ONLY)
    try:
        wait_for(
            lambda: "cannot create sandboxes/exec" in str(run_true(api, tenant, "denied")),
            timeout=PROPAGATION,
            what="the API server to let the caller's get through to the gateway's review",
        )
        asked, kept = reviews(gateway, "api"), reviews(gateway, "cache")
        for _ in range(3):
            answer = run_true(api, tenant, "denied")
            assert isinstance(answer, str) and answer.startswith("403"), answer
            assert "cannot create sandboxes/exec" in answer, answer
        assert reviews(gateway, "api") - asked == 3, "a denied caller was not asked each time"
        assert reviews(gateway, "cache") == kept, "a denial was answered from the cache"
        _grant(kube, tenant, f"{name}-create", EDIT, (tenant, name))
        granted = time.monotonic()
        wait_for(
            lambda: run_true(api, tenant, "denied") == 0,
            timeout=PROPAGATION,
            what="the caller granted create to run its command",
        )
        assert time.monotonic() - granted < TTL, "the grant waited out a kept denial"
    finally:
        api.close()
        delete_sandbox(kube, tenant, "denied")
