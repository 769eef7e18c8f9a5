"""Streams meet suspensions, end to end: the CLI, the real API server, the stream
gateway, an agent sampling idleness every 0.3 s and the real containerd.

A file written through the files API while an idle suspension commits is either
refused or in what the sandbox resumes from, never acknowledged and lost: the
commit is held right after containerd's Diff read the container's files, and the
write is sent then. A stream whose admission waits for a restore that cannot
proceed, and whose peer gives up, frees its slot and its sandbox's in-use mark:
the node's slot count goes back, and the sandbox is suspended for being idle again
once it has run. A write whose stream is open when a suspend is asked lands before
the commit: the suspend waits for its stream. The rig is
``tests/support/streams.py``'s; the agent is this module's own.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from kubernetes import client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from sandlot.adapters.mtls import client_context
from sandlot.adapters.runtime import ContainerInfo
from sandlot.agent.main import Agent
from sandlot.agent.streams import StreamServer
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import SANDBOX_LABEL
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.streamnet import StreamAddress
from sandlot.policy.agentcerts import agent_server_name
from sandlot.policy.idle import restores_for_stream
from sandlot.policy.streams import (
    API_PREFIX,
    CALLER_HEADER,
    OPEN_TIMEOUT_HEADER,
    STATUS,
    STDIN,
    STREAM_OPTIONS_HEADER,
    SUBPROTOCOL,
    StreamEnd,
    agent_request,
    close_stdin_frame,
    encode_frame,
    end_of,
    parse_api_request,
)
from tests.integration.test_agent_idle_pause import (
    IDLE_TIMEOUT,
    hold_still,
    idle_suspending_sandbox,
    suspended_is,
)
from tests.integration.test_agent_pause import watch_says
from tests.support.streams import StartStreamAgent, delete_sandbox, running_sandbox, sandlot
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

HELD = 60.0  # seconds a held step waits for the test at most
WRITTEN = "acknowledged\n"


@pytest.fixture(scope="module")
def agent(start_stream_agent: StartStreamAgent) -> Agent:
    """The stream rig's agent, sampling idleness every 0.3 s."""
    return start_stream_agent("streamsuspend", idle_interval="0.3s")


def set_mode(kube: client.ApiClient, namespace: str, name: str, mode: str) -> None:
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name, {"spec": {"operatingMode": mode}}
    )


def sync_passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_sync_passes_total") or 0


def streams_of(agent: Agent) -> StreamServer:
    assert agent.streams is not None, "the agent serves no streams"
    return agent.streams


def idle_suspends(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_idle_suspends_total") or 0


def test_a_file_written_while_an_idle_suspension_commits_is_refused_not_lost(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    tmp_path: Path,
) -> None:
    _, tenant = places
    kubeconfig = users["operator-person"]
    runtime = agent.parts.runtime
    commit = runtime.commit_container
    read, go = threading.Event(), threading.Event()

    def held(container_id: str, image: str, labels: Mapping[str, str], *, timeout: float) -> str:
        digest = commit(container_id, image, labels, timeout=timeout)
        read.set()  # the container's files are in the committed layer now
        go.wait(HELD)
        return digest

    local = tmp_path / "late.txt"
    local.write_text(WRITTEN)
    with mock.patch.object(runtime, "commit_container", held):
        try:
            idle_suspending_sandbox(kube, agent, tenant, "committing")
            wait_for(read.is_set, timeout=IDLE_TIMEOUT + 30, what="the idle suspension's commit")
            body = agent.sandbox_watch.get(f"{tenant}/committing") or {}
            assert not restores_for_stream(body), "the agent's view says suspended already"
            wrote = sandlot(
                "cp", str(local), "committing:/late", "-n", tenant, kubeconfig=kubeconfig
            )
        finally:
            go.set()
    suspended_is(kube, tenant, "committing", "True", "Idle", timeout=30)
    hold_still(kube, tenant, "committing")
    back = sandlot("exec", "committing", "-n", tenant, "--", "cat", "/late", kubeconfig=kubeconfig)
    if wrote.returncode == 0:
        assert back.stdout == WRITTEN, (
            "a write acknowledged during the commit is not in the restored sandbox: "
            f"cat says {back.stdout!r}, {back.stderr!r}"
        )
    assert wrote.returncode == 1, f"not refused: {wrote.stdout!r} {wrote.stderr!r}"
    assert "is being suspended" in wrote.stderr, wrote.stderr
    assert back.returncode == 1, f"a refused write landed: {back.stdout!r}"
    delete_sandbox(kube, tenant, "committing")


def open_write(
    agent: Agent,
    certs: StreamCerts,
    address: StreamAddress,
    namespace: str,
    name: str,
    path: str,
) -> ClientConnection:
    """A files write into ``path`` opened on the agent as the gateway opens it."""
    where, options = agent_request(
        parse_api_request(
            f"{API_PREFIX}/namespaces/{namespace}/sandboxes/{name}/files?op=write&path={path}"
        )
    )
    return connect(
        f"wss://{address.ip}:{streams_of(agent).port}{where}",
        ssl=client_context(
            str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        ),
        server_hostname=agent_server_name(agent.settings.node_name),
        additional_headers={STREAM_OPTIONS_HEADER: options, CALLER_HEADER: "test"},
        subprotocols=[Subprotocol(SUBPROTOCOL)],
        open_timeout=30,
        proxy=None,
        legacy=True,  # one connection, closed by the test
    )


def status_of(stream: ClientConnection) -> StreamEnd:
    """The stream's status (what the CLI reports), read until it comes or 30 s pass."""
    deadline = time.monotonic() + 30
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = stream.recv(timeout=left)
        except TimeoutError:
            break
        except ConnectionClosed:
            return end_of(None)
        if isinstance(message, bytes) and message[:1] == bytes([STATUS]):
            return end_of(message[1:])
    pytest.fail("no status within 30 s")


def test_a_write_open_when_a_suspend_is_asked_lands_before_the_commit(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    stream_certs: StreamCerts,
    stream_address: StreamAddress,
) -> None:
    """The suspend waits for the write's stream to end, so the acknowledged file is
    in what the sandbox starts again from."""
    _, tenant = places
    key = f"{tenant}/asked"
    running_sandbox(kube, agent, tenant, "asked", "sleep 100000")
    runtime = agent.parts.runtime
    commit = runtime.commit_container
    read, go = threading.Event(), threading.Event()

    def held(container_id: str, image: str, labels: Mapping[str, str], *, timeout: float) -> str:
        digest = commit(container_id, image, labels, timeout=timeout)
        read.set()
        go.wait(HELD)
        return digest

    with mock.patch.object(runtime, "commit_container", held):
        try:
            stream = open_write(agent, stream_certs, stream_address, tenant, "asked", "/asked")
            stream.send(encode_frame(STDIN, WRITTEN[:5].encode()))
            passes = sync_passes(agent)
            set_mode(kube, tenant, "asked", "Suspended")
            wait_for(
                lambda: (
                    read.is_set()
                    or (
                        watch_says(
                            agent,
                            key,
                            lambda sb: sb.get("spec", {}).get("operatingMode") == "Suspended",
                        )
                        and sync_passes(agent) >= passes + 2
                    )
                ),
                timeout=30,
                what="the agent to see the suspend and pass over it, or the commit",
            )
            stream.send(encode_frame(STDIN, WRITTEN[5:].encode()))
            stream.send(close_stdin_frame())
            wrote = status_of(stream)
            stream.close()
        finally:
            go.set()
    assert wrote == StreamEnd(0), f"the write was not acknowledged: {wrote}"
    suspended_is(kube, tenant, "asked", "True", "Suspended", timeout=30)
    set_mode(kube, tenant, "asked", "Running")
    back = suspended_is(kube, tenant, "asked", "False", "Restored", timeout=30)
    kept = Path(f"/proc/{back['status']['pid']}/root/asked")
    assert kept.exists(), (
        "a write acknowledged before the commit ended is not in the restored sandbox"
    )
    assert kept.read_text() == WRITTEN
    delete_sandbox(kube, tenant, "asked")


def test_a_stream_that_leaves_while_its_restore_cannot_proceed_frees_its_slot(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    users: dict[str, Path],
    stream_certs: StreamCerts,
    stream_address: StreamAddress,
) -> None:
    _, tenant = places
    key = f"{tenant}/stuck"
    streams = streams_of(agent)
    idle_suspending_sandbox(kube, agent, tenant, "stuck")
    suspended_is(kube, tenant, "stuck", "True", "Idle", timeout=IDLE_TIMEOUT + 30)
    wait_for(
        lambda: (
            restores_for_stream(agent.sandbox_watch.get(key) or {})
            and not [
                c
                for c in agent.parts.runtime.list_containers(timeout=5)
                if c.labels.get(SANDBOX_LABEL) == key
            ]
        ),
        timeout=30,
        what="the agent's watch to see the idle suspension, and its container removed",
    )
    suspensions = agent.parts.sync.suspensions
    restore = suspensions.restore
    entered, go = threading.Event(), threading.Event()

    def stuck(sb: Mapping[str, Any], container: ContainerInfo | None) -> Any:
        entered.set()
        go.wait(HELD)
        return restore(sb, container)

    path, options = agent_request(
        parse_api_request(f"{API_PREFIX}/namespaces/{tenant}/sandboxes/stuck/exec?command=true")
    )
    gateway_tls = client_context(
        str(stream_certs.agent_ca.cert),
        str(stream_certs.gateway.cert),
        str(stream_certs.gateway.key),
    )
    # As the gateway opens it, saying it waits a minute for the upgrade.
    upgrade = (
        f"GET {path} HTTP/1.1\r\nHost: agent\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n"
        f"{STREAM_OPTIONS_HEADER}: {options}\r\n{CALLER_HEADER}: test\r\n"
        f"{OPEN_TIMEOUT_HEADER}: 60\r\n\r\n"
    )
    with mock.patch.object(suspensions, "restore", stuck):
        try:
            with (
                socket.create_connection((stream_address.ip, streams.port), timeout=30) as raw,
                gateway_tls.wrap_socket(
                    raw, server_hostname=agent_server_name(agent.settings.node_name)
                ) as peer,
            ):
                peer.sendall(upgrade.encode())
                wait_for(
                    lambda: (
                        entered.is_set()
                        and streams.sessions(key) == 1
                        and agent.parts.idle.suspends.waking(key)
                    ),
                    timeout=30,
                    what="the stream's admission waiting for the restore it asked for",
                )
            # The peer went away while its admission waits.
            wait_for(
                lambda: (
                    streams.sessions(key) == 0
                    and key not in streams.in_use()
                    and not agent.parts.idle.suspends.waking(key)
                ),
                timeout=15,
                what="the slot and in-use mark of the stream that left to be freed",
            )
        finally:
            go.set()

    # It can idle again: a use starts it, and once quiet it is suspended again.
    suspends = idle_suspends(agent)
    ran = sandlot("exec", "stuck", "-n", tenant, "--", "true", kubeconfig=users["operator-person"])
    assert ran.returncode == 0, ran.stderr
    wait_for(
        lambda: idle_suspends(agent) >= suspends + 1,
        timeout=IDLE_TIMEOUT + 30,
        what="the sandbox to be suspended for being idle again",
    )
    wait_for(
        lambda: not streams.slots().used,
        timeout=15,
        what="every stream slot of the node free again",
    )
    delete_sandbox(kube, tenant, "stuck")
