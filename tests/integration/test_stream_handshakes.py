"""The stream servers' sockets and handshakes, with their real TLS files: the gateway
listens where its settings say (every address when ``bind`` is empty, the chart's
default) and answers a slow admission; the agent waits out a slow handshake."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from sandlot.adapters.mtls import client_context, server_context
from sandlot.devtools.certs import StreamCerts
from sandlot.gateway.server import Backends, Gateway, Refusal, Sessions
from sandlot.policy.agentcerts import agent_server_name
from sandlot.policy.streamaccess import RequestHeaderConfig

pytestmark = pytest.mark.integration


def _agent(certs: StreamCerts, node: str) -> tuple[str, str]:
    pair = certs.agent(node)
    return str(pair.cert), str(pair.key)


def _nowhere(*_: object) -> object:
    raise Refusal(503, "no cluster in this test")


@pytest.mark.parametrize("bind", ["", "127.0.0.1"], ids=["every-address", "one-address"])
def test_the_gateway_listens_on_the_address_it_is_given(tmp_path: Path, bind: str) -> None:
    certs = StreamCerts.create(tmp_path, "sandlot-system")
    gateway = Gateway(
        bind=bind,
        port=0,
        server_tls=server_context(
            str(certs.gateway.cert), str(certs.gateway.key), str(certs.ca.cert)
        ),
        agent_tls=client_context(
            str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        ),
        requestheader=RequestHeaderConfig,
        backends=Backends(review=_nowhere, node_of=_nowhere, agent_of=_nowhere),  # type: ignore[arg-type]
        sessions=Sessions(4, 2),
        call_timeout=5.0,
    )
    gateway.start()
    try:
        ctx = ssl.create_default_context(cafile=str(certs.ca.cert))
        ctx.load_cert_chain(str(certs.front_proxy.cert), str(certs.front_proxy.key))
        name = "sandlot-gateway.sandlot-system.svc"
        with (
            socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=name) as conn,
        ):
            conn.sendall(b"GET /apis HTTP/1.1\r\nHost: gateway\r\n\r\n")
            answer = conn.recv(4096).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 200"), answer
    finally:
        gateway.shutdown()


def test_a_slow_admission_is_answered_not_dropped(tmp_path: Path) -> None:
    """Each of the gateway's calls before the upgrade may take up to ``call_timeout``;
    together they take longer than one. The API server must still get an answer (here
    the refusal of the last step), never a socket closed mid-handshake."""
    import time

    certs = StreamCerts.create(tmp_path, "sandlot-system")

    def slow(answer: object) -> object:
        def call(*_: object) -> object:
            time.sleep(0.6)
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call

    gateway = Gateway(
        bind="127.0.0.1",
        port=0,
        server_tls=server_context(
            str(certs.gateway.cert), str(certs.gateway.key), str(certs.ca.cert)
        ),
        agent_tls=client_context(
            str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        ),
        requestheader=RequestHeaderConfig,
        backends=Backends(
            review=slow({"allowed": True}),  # type: ignore[arg-type]
            node_of=slow("node-1"),  # type: ignore[arg-type]
            agent_of=slow(Refusal(503, "no agent on node-1")),  # type: ignore[arg-type]
        ),
        sessions=Sessions(4, 2),
        call_timeout=1.0,
    )
    gateway.start()
    try:
        ctx = ssl.create_default_context(cafile=str(certs.ca.cert))
        ctx.load_cert_chain(
            str(certs.front_proxy.cert), str(certs.front_proxy.key)
        )  # the "front proxy"
        request = (
            "GET /apis/subresources.sandlot.dev/v1alpha1/namespaces/ns/sandboxes/sb/exec"
            "?command=true HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\nX-Remote-User: alice\r\n\r\n"
        )
        with (
            socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as raw,
            ctx.wrap_socket(raw, server_hostname="sandlot-gateway.sandlot-system.svc") as conn,
        ):
            conn.sendall(request.encode())
            answer = conn.recv(4096).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 503"), f"no answer, or not the refusal: {answer!r}"
        assert "no agent on node-1" in answer
    finally:
        gateway.shutdown()


def test_the_agent_waits_out_a_slow_handshake_longer_than_a_containerd_call(
    tmp_path: Path,
) -> None:
    """On a loaded node the gateway's TLS handshake and upgrade can take longer than
    one containerd call's deadline; the agent must still answer (the gateway waits
    longer, and read a dropped socket as a failed stream)."""
    import threading
    import time

    from sandlot.agent.streams import StreamServer

    certs = StreamCerts.create(tmp_path, "sandlot-system")
    server = StreamServer(
        "node-x",
        bind="127.0.0.1",
        port=0,
        tls=server_context(*_agent(certs, "node-x"), str(certs.ca.cert)),
        client_names=("sandlot-gateway",),
        sandbox=lambda _key: None,
        log_dir="",
        execs=None,
        call_timeout=0.2,
        stop=threading.Event(),
    )
    server.start()
    try:
        ctx = client_context(
            str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        )
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=20) as raw,
            ctx.wrap_socket(raw, server_hostname=agent_server_name("node-x")) as conn,
        ):
            time.sleep(1.0)  # a loaded machine: the request comes late
            conn.sendall(
                b"GET /sandboxes/ns/sb/exec HTTP/1.1\r\nHost: agent\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\nX-Sandlot-Stream-Options: command=true\r\n\r\n"
            )
            answer = conn.recv(4096).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 404"), f"dropped instead of answered: {answer!r}"
    finally:
        server.shutdown()


def test_the_agent_refuses_streams_past_its_own_cap_and_frees_a_place_when_one_ends(
    tmp_path: Path,
) -> None:
    """The agent's own cap holds whatever the gateways let through: with one place,
    a second stream is refused (429, naming the node) while a follow is open, and
    admitted once it ended."""
    import threading
    import time

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import ClientConnection, connect
    from websockets.typing import Subprotocol

    from sandlot.agent.streams import StreamServer

    certs = StreamCerts.create(tmp_path, "sandlot-system")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ns_sb_u1.log").write_text("line\n")
    sandbox = {
        "metadata": {"namespace": "ns", "name": "sb", "uid": "u1"},
        "status": {"phase": "Running"},
    }
    server = StreamServer(
        "node-x",
        bind="127.0.0.1",
        port=0,
        tls=server_context(*_agent(certs, "node-x"), str(certs.ca.cert)),
        client_names=("sandlot-gateway",),
        sandbox=lambda key: sandbox if key == "ns/sb" else None,
        log_dir=str(logs),
        execs=None,
        call_timeout=2.0,
        stop=threading.Event(),
        max_sessions=1,
    )
    server.start()
    ctx = client_context(str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key))

    def follow() -> ClientConnection:
        return connect(
            f"wss://127.0.0.1:{server.port}/sandboxes/ns/sb/log",
            ssl=ctx,
            server_hostname=agent_server_name("node-x"),
            additional_headers={"X-Sandlot-Stream-Options": "follow=true"},
            subprotocols=[Subprotocol("v5.channel.k8s.io")],
            open_timeout=10,
            proxy=None,
            legacy=True,
        )

    try:
        first = follow()
        assert first.recv(timeout=10)[1:] == b"line\n"
        with pytest.raises(InvalidStatus) as refused:
            follow()
        assert refused.value.response.status_code == 429
        assert b"node-x has 1 streams open" in refused.value.response.body
        first.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                again = follow()
                break
            except InvalidStatus as e:
                assert e.response.status_code == 429
                assert time.monotonic() < deadline, "the place was never freed"
        again.close()
    finally:
        server.shutdown()


IDLE_SUSPENDED = {
    "metadata": {"namespace": "ns", "name": "sb", "uid": "u1"},
    "spec": {"operatingMode": "Running"},
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Suspended", "status": "True", "reason": "Idle"}],
    },
}


def test_a_peer_gone_while_its_admission_waits_for_a_restore_frees_its_slot(
    tmp_path: Path,
) -> None:
    """An exec into an idle-suspended sandbox whose restore cannot proceed: the peer
    gives up and closes, and the agent's slot (the sandbox's in-use mark) is freed
    then and the wait ends, not when the restore would have answered."""
    import threading
    import time

    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    from sandlot.agent.streams import StreamServer

    certs = StreamCerts.create(tmp_path, "sandlot-system")
    server = StreamServer(
        "node-x",
        bind="127.0.0.1",
        port=0,
        tls=server_context(*_agent(certs, "node-x"), str(certs.ca.cert)),
        client_names=("sandlot-gateway",),
        sandbox=lambda key: IDLE_SUSPENDED if key == "ns/sb" else None,
        log_dir="",
        execs=None,  # never reached: the upgrade never happens
        call_timeout=2.0,
        stop=threading.Event(),
    )
    waiting, ended = threading.Event(), threading.Event()

    def stuck(*asked: object) -> str:  # a restore that cannot proceed
        gone = asked[3] if len(asked) > 3 else lambda: False
        waiting.set()
        deadline = time.monotonic() + 30
        while not gone() and time.monotonic() < deadline:  # type: ignore[operator]
            ended.wait(0.05)
        return "cannot start again"

    server.restore = stuck
    server.start()
    ctx = client_context(str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key))
    try:
        with pytest.raises(TimeoutError):
            connect(
                f"wss://127.0.0.1:{server.port}/sandboxes/ns/sb/exec",
                ssl=ctx,
                server_hostname=agent_server_name("node-x"),
                additional_headers={"X-Sandlot-Stream-Options": "command=true"},
                subprotocols=[Subprotocol("v5.channel.k8s.io")],
                open_timeout=1,
                proxy=None,
            )
        assert waiting.is_set(), "the admission did not wait for the restore"
        deadline = time.monotonic() + 10
        while server.sessions("ns/sb") or server.in_use():
            assert time.monotonic() < deadline, "the slot of a peer gone outlived its connection"
            ended.wait(0.05)
        assert not server.slots().used
    finally:
        ended.set()
        server.shutdown()


def test_a_user_gone_while_the_gateway_reaches_the_agent_gives_its_session_back(
    tmp_path: Path,
) -> None:
    """The API server's connection closes while the gateway still reaches the node's
    agent: the gateway's session and its connection to the agent are let go, the
    agent's slot with it, instead of waiting for a relay that never starts."""
    import threading
    import time

    from sandlot.agent.streams import StreamServer

    certs = StreamCerts.create(tmp_path, "sandlot-system")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ns_sb_u1.log").write_text("line\n")
    sandbox = {
        "metadata": {"namespace": "ns", "name": "sb", "uid": "u1"},
        "status": {"phase": "Running"},
    }
    agent = StreamServer(
        "node-1",
        bind="127.0.0.1",
        port=0,
        tls=server_context(*_agent(certs, "node-1"), str(certs.ca.cert)),
        client_names=("sandlot-gateway",),
        sandbox=lambda key: sandbox if key == "ns/sb" else None,
        log_dir=str(logs),
        execs=None,
        call_timeout=2.0,
        stop=threading.Event(),
    )
    agent.start()
    user_gone = threading.Event()

    def node_of(*_: object) -> str:  # the Sandbox's read takes until the user left
        user_gone.wait(20)
        return "node-1"

    gateway = Gateway(
        bind="127.0.0.1",
        port=0,
        server_tls=server_context(
            str(certs.gateway.cert), str(certs.gateway.key), str(certs.ca.cert)
        ),
        agent_tls=client_context(
            str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        ),
        requestheader=RequestHeaderConfig,
        backends=Backends(
            review=lambda _spec: {"allowed": True},
            node_of=node_of,
            agent_of=lambda _node: ("127.0.0.1", agent.port),
        ),
        sessions=Sessions(4, 2),
        call_timeout=10.0,
    )
    gateway.start()
    try:
        ctx = ssl.create_default_context(cafile=str(certs.ca.cert))
        ctx.load_cert_chain(
            str(certs.front_proxy.cert), str(certs.front_proxy.key)
        )  # the "front proxy"
        request = (
            "GET /apis/subresources.sandlot.dev/v1alpha1/namespaces/ns/sandboxes/sb/log"
            "?follow=true HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\nX-Remote-User: alice\r\n\r\n"
        )
        with (
            socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as raw,
            ctx.wrap_socket(raw, server_hostname="sandlot-gateway.sandlot-system.svc") as conn,
        ):
            conn.sendall(request.encode())
            deadline = time.monotonic() + 10
            while gateway.sessions.open == 0:  # the admission holds its session
                assert time.monotonic() < deadline, "the gateway never took the session"
                user_gone.wait(0.05)
        user_gone.set()  # the user's connection is closed: the admission goes on
        deadline = time.monotonic() + 10
        while gateway.sessions.open:
            assert time.monotonic() < deadline, "the gateway's session outlived its user"
            time.sleep(0.05)
        while agent.slots().used:  # the agent connection let go with it
            assert time.monotonic() < deadline, f"agent slots {dict(agent.slots().used)}"
            time.sleep(0.05)
    finally:
        user_gone.set()
        gateway.shutdown()
        agent.shutdown()


def test_a_502_names_the_node_not_the_agents_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent cannot be reached: the user learns which node, never the agent pod's
    address and port (the cluster's internal network); the gateway's log keeps them."""
    certs = StreamCerts.create(tmp_path, "sandlot-system")
    with socket.socket() as probe:  # a port nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    gateway = Gateway(
        bind="127.0.0.1",
        port=0,
        server_tls=server_context(
            str(certs.gateway.cert), str(certs.gateway.key), str(certs.ca.cert)
        ),
        agent_tls=client_context(
            str(certs.agent_ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        ),
        requestheader=RequestHeaderConfig,
        backends=Backends(
            review=lambda _spec: {"allowed": True},
            node_of=lambda _ns, _name: "node-1",
            agent_of=lambda _node: ("127.0.0.1", closed),
        ),
        sessions=Sessions(4, 2),
        call_timeout=5.0,
    )
    gateway.start()
    try:
        ctx = ssl.create_default_context(cafile=str(certs.ca.cert))
        ctx.load_cert_chain(
            str(certs.front_proxy.cert), str(certs.front_proxy.key)
        )  # the "front proxy"
        request = (
            "GET /apis/subresources.sandlot.dev/v1alpha1/namespaces/ns/sandboxes/sb/exec"
            "?command=true HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\nX-Remote-User: alice\r\n\r\n"
        )
        with (
            caplog.at_level("INFO", logger="sandlot.gateway.server"),
            socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as raw,
            ctx.wrap_socket(raw, server_hostname="sandlot-gateway.sandlot-system.svc") as conn,
        ):
            conn.sendall(request.encode())
            answer = conn.recv(4096).decode(errors="replace")
    finally:
        gateway.shutdown()
    assert answer.startswith("HTTP/1.1 502"), f"not the refusal: {answer!r}"
    assert "cannot reach the agent of node node-1" in answer, answer
    assert "127.0.0.1" not in answer and str(closed) not in answer, answer
    assert f"127.0.0.1:{closed}" in caplog.text, "the gateway's log keeps the address"
