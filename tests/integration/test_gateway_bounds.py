"""The stream gateway's own bounds, played by the wrong party over real TLS: a
tenant's many ServiceAccounts against the namespace cap, a group's many users
against the group cap, a silent relay against
the idle timeout, a rotated-out front-proxy CA against the handshake, a remembered
agent that no longer holds the sandbox, an agent slow to close after its status. The rig is
test_stream_handshakes.py's: the gateway and an agent ``StreamServer`` with their
real certificates, the cluster's answers given as ``Backends``."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import ServerConnection, serve
from websockets.typing import Subprotocol

from sandlot.adapters.mtls import client_context, server_context
from sandlot.agent.streams import StreamServer
from sandlot.devtools.certs import StreamCerts
from sandlot.gateway.placements import CachedPlacements
from sandlot.gateway.server import Backends, Gateway, Sessions
from sandlot.policy.streamaccess import RequestHeaderConfig
from sandlot.policy.streams import STATUS, decode_frame, encode_frame, exit_status

pytestmark = pytest.mark.integration

FOLLOW = "/apis/subresources.sandlot.dev/v1alpha1/namespaces/ns/sandboxes/sb/log?follow=true"
SANDBOX = {
    "metadata": {"namespace": "ns", "name": "sb", "uid": "u1"},
    "status": {"phase": "Running"},
}


@dataclass
class Rig:
    certs: StreamCerts
    agent: StreamServer
    tmp: Path

    def gateway(self, sessions: Sessions, node: str = "node-1", **options: object) -> Gateway:
        gateway = Gateway(
            bind="127.0.0.1",
            port=0,
            server_tls=options.pop(  # type: ignore[arg-type]
                "server_tls",
                server_context(
                    str(self.certs.gateway.cert),
                    str(self.certs.gateway.key),
                    str(self.certs.ca.cert),
                ),
            ),
            agent_tls=client_context(
                str(self.certs.agent_ca.cert),
                str(self.certs.gateway.cert),
                str(self.certs.gateway.key),
            ),
            requestheader=RequestHeaderConfig,
            backends=options.pop(  # type: ignore[arg-type]
                "backends",
                Backends(
                    review=lambda _spec: {"allowed": True},
                    node_of=lambda _ns, _name: node,
                    agent_of=lambda _node: ("127.0.0.1", self.agent.port),
                ),
            ),
            sessions=sessions,
            call_timeout=10.0,
            **options,  # type: ignore[arg-type]
        )
        gateway.start()
        return gateway

    def front_proxy(self, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs.ca.cert))
        ctx.load_cert_chain(
            str(cert or self.certs.front_proxy.cert), str(key or self.certs.front_proxy.key)
        )
        return ctx

    def follow(
        self,
        gateway: Gateway,
        user: str,
        ctx: ssl.SSLContext | None = None,
        groups: tuple[str, ...] = (),
    ) -> ClientConnection:
        """A `logs -f` as the API server's front proxy would open it for ``user`` (in
        ``groups``)."""
        return connect(
            f"wss://127.0.0.1:{gateway.port}{FOLLOW}",
            ssl=ctx or self.front_proxy(),
            server_hostname="sandlot-gateway.sandlot-system.svc",
            additional_headers=[("X-Remote-User", user), *(("X-Remote-Group", g) for g in groups)],
            subprotocols=[Subprotocol("v5.channel.k8s.io")],
            open_timeout=20,
            proxy=None,
            legacy=True,
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    certs = StreamCerts.create(tmp_path, "sandlot-system")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ns_sb_u1.log").write_text("line\n")
    agent = StreamServer(
        "node-1",
        bind="127.0.0.1",
        port=0,
        tls=server_context(
            str(certs.agent("node-1").cert), str(certs.agent("node-1").key), str(certs.ca.cert)
        ),
        client_names=("sandlot-gateway",),
        sandbox=lambda key: SANDBOX if key == "ns/sb" else None,
        log_dir=str(logs),
        execs=None,
        call_timeout=5.0,
        stop=threading.Event(),
    )
    agent.start()
    try:
        yield Rig(certs, agent, tmp_path)
    finally:
        agent.shutdown()


def refusal(rig: Rig, gateway: Gateway, user: str, groups: tuple[str, ...] = ()) -> tuple[int, str]:
    with pytest.raises(InvalidStatus) as refused:
        rig.follow(gateway, user, groups=groups).close()
    response = refused.value.response
    return response.status_code, response.body.decode(errors="replace")


def once_freed(follow: Callable[[], ClientConnection]) -> ClientConnection:
    """``follow`` once the cap that refused it (429) has a place again, within 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return follow()
        except InvalidStatus as e:
            assert e.response.status_code == 429, e.response.body
            assert time.monotonic() < deadline, "the ended stream's place was never freed"
            time.sleep(0.05)


def test_an_agent_certified_for_another_node_is_refused(rig: Rig) -> None:
    """The sandbox is on node-2; what answers at node-2's agent address holds node-1's
    certificate, of the same agent CA: the gateway refuses it in the handshake, before
    the user's request reaches it, and says so. Dialled for node-1, it is served."""
    wrong = rig.gateway(Sessions(8, 8), node="node-2")
    try:
        status, body = refusal(rig, wrong, "alice")
    finally:
        wrong.shutdown()
    assert status == 502, body
    assert "reached for node node-2 is not certified for node node-2" in body, body
    right = rig.gateway(Sessions(8, 8), node="node-1")
    try:
        rig.follow(right, "alice").close()
    finally:
        right.shutdown()


def test_a_tenants_many_service_accounts_share_their_namespaces_cap(rig: Rig) -> None:
    """Each ServiceAccount is a user of its own: three of team-a's, under a per-user
    cap of 2 each, get only the namespace's 2 streams; another namespace's and a
    plain user's streams are not held off, and an ended one frees its place."""
    gateway = rig.gateway(Sessions(8, 2, 2))
    held: list[ClientConnection] = []
    try:
        for name in ("ci", "bot"):
            held.append(rig.follow(gateway, f"system:serviceaccount:team-a:{name}"))
        status, body = refusal(rig, gateway, "system:serviceaccount:team-a:third")
        assert status == 429, body
        assert 'namespace "team-a"' in body and "max_sessions_per_namespace" in body, body
        held.append(rig.follow(gateway, "system:serviceaccount:team-b:ci"))
        held.append(rig.follow(gateway, "alice"))
        held.pop(0).close()
        held.append(once_freed(lambda: rig.follow(gateway, "system:serviceaccount:team-a:third")))
    finally:
        for one in held:
            one.close()
        gateway.shutdown()


def test_a_groups_many_users_share_its_cap(rig: Rig) -> None:
    """An identity provider mints users at will: three of group team-a, under a
    per-user cap of 2 each, get only the group's 2 streams; a user of another group
    (everyone shares system:authenticated) is not held off, and an ended stream
    frees its group's place."""
    gateway = rig.gateway(Sessions(8, 2, 8, 2))
    team_a = ("system:authenticated", "team-a")
    held: list[ClientConnection] = []
    try:
        held.append(rig.follow(gateway, "oidc:ann", groups=team_a))
        held.append(rig.follow(gateway, "oidc:ben", groups=team_a))
        status, body = refusal(rig, gateway, "oidc:cat", team_a)
        assert status == 429, body
        assert 'group "team-a"' in body and "max_sessions_per_group" in body, body
        held.append(rig.follow(gateway, "oidc:dan", groups=("system:authenticated", "team-b")))
        held.pop(0).close()
        held.append(once_freed(lambda: rig.follow(gateway, "oidc:cat", groups=team_a)))
    finally:
        for one in held:
            one.close()
        gateway.shutdown()


def test_a_relay_silent_both_ways_is_closed_and_frees_its_caps(rig: Rig) -> None:
    """A follow whose log says nothing more, and whose user sends nothing: past the
    gateway's idle timeout both sides are closed, the gateway's session and the
    agent's slot freed, whatever the agent's own (longer) idle timeout."""
    gateway = rig.gateway(Sessions(4, 1), idle_timeout=1.0)
    try:
        user = rig.follow(gateway, "alice")
        assert user.recv(timeout=10)[1:] == b"line\n"  # the relay ran before it went quiet
        assert gateway.sessions.open == 1
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                user.recv(timeout=20)
        assert "idle_timeout" in (closed.value.rcvd.reason if closed.value.rcvd else ""), (
            f"closed, but not by the idle timeout: {closed.value!r}"
        )
        deadline = time.monotonic() + 10
        while gateway.sessions.open or rig.agent.slots().used:
            assert time.monotonic() < deadline, (
                f"an idle stream kept its caps: gateway {gateway.sessions.open}, "
                f"agent {dict(rig.agent.slots().used)}"
            )
            time.sleep(0.05)
        rig.follow(gateway, "alice").close()  # alice's one place is hers again
    finally:
        gateway.shutdown()


# A client certificate the server refuses: the handshake fails (TLS 1.2), or under
# TLS 1.3 the server's alert closes the connection before any HTTP answer.
HANDSHAKE_REFUSED = (ssl.SSLError, OSError, InvalidMessage, ConnectionClosed)


def test_a_front_proxy_ca_removed_from_its_file_stops_being_trusted(rig: Rig) -> None:
    """The request-header CA file names CA A, then is rewritten to name CA B only (A
    rotated out, or found compromised): after the gateway's refresh, a client
    certificate of A no longer passes the handshake, one of B does, and nothing was
    restarted."""
    from sandlot.devtools.certs import CA, FRONT_PROXY_NAME
    from sandlot.gateway.runner import build
    from sandlot.gateway.settings import GatewaySettings

    def front_proxy_of(name: str) -> tuple[Path, ssl.SSLContext]:
        ca = CA.create(rig.tmp / name, f"{name}-ca")
        pair = ca.issue(rig.tmp / name, FRONT_PROXY_NAME)
        return ca.cert, rig.front_proxy(pair.cert, pair.key)

    a_ca, as_a = front_proxy_of("a")
    b_ca, as_b = front_proxy_of("b")
    ca_file = rig.tmp / "requestheader-ca.crt"
    ca_file.write_bytes(a_ca.read_bytes())
    settings = GatewaySettings(
        bind="127.0.0.1",
        port=0,
        tls_cert=str(rig.certs.gateway.cert),
        tls_key=str(rig.certs.gateway.key),
        stream_ca=str(rig.certs.agent_ca.cert),
        requestheader_client_ca=str(ca_file),
        metrics_port=0,
    )
    backends = Backends(
        review=lambda _spec: {"allowed": True},
        node_of=lambda _ns, _name: "node-1",
        agent_of=lambda _node: ("127.0.0.1", rig.agent.port),
    )
    parts = build(settings, None, backends=backends)
    parts.gateway.start()
    try:
        rig.follow(parts.gateway, "alice", as_a).close()  # A is the front proxy today
        with pytest.raises(HANDSHAKE_REFUSED):
            rig.follow(parts.gateway, "alice", as_b).close()

        ca_file.write_bytes(b_ca.read_bytes())
        parts.refresh()

        with pytest.raises(HANDSHAKE_REFUSED):  # TLS refused it: no HTTP answer at all
            rig.follow(parts.gateway, "mallory", as_a).close()
        rig.follow(parts.gateway, "alice", as_b).close()
    finally:
        parts.gateway.shutdown()


def test_a_sandbox_remembered_on_its_old_node_is_reached_where_it_is_now(rig: Rig) -> None:
    """The gateway remembers where a sandbox's agent is (``gateway.placements``). The
    sandbox then moves from node-1 to node-2: node-1's agent answers it is not there,
    and the gateway asks again and reaches node-2's. node-2's agent then restarts at
    another port: the dial to the remembered one fails, and the gateway finds the new."""
    where = {"ns/sb": "node-1"}

    def agent_of_node(node: str) -> StreamServer:
        agent = StreamServer(
            node,
            bind="127.0.0.1",
            port=0,
            tls=server_context(
                str(rig.certs.agent(node).cert),
                str(rig.certs.agent(node).key),
                str(rig.certs.ca.cert),
            ),
            client_names=("sandlot-gateway",),
            sandbox=lambda key: SANDBOX if where.get(key) == node else None,
            log_dir=str(rig.tmp / "logs"),
            execs=None,
            call_timeout=5.0,
            stop=threading.Event(),
        )
        agent.start()
        return agent

    agents = {"node-1": agent_of_node("node-1"), "node-2": agent_of_node("node-2")}
    reads: list[str] = []

    def node_of(namespace: str, name: str) -> str:
        reads.append(f"sandbox {namespace}/{name}")
        return where[f"{namespace}/{name}"]

    def agent_of(node: str) -> tuple[str, int]:
        reads.append(f"agent {node}")
        return "127.0.0.1", agents[node].port

    placements = CachedPlacements(node_of, agent_of, ttl=3600.0)
    gateway = rig.gateway(
        Sessions(8, 8),
        backends=Backends(
            review=lambda _spec: {"allowed": True},
            node_of=placements.node_of,
            agent_of=placements.agent_of,
            forget=placements.forget,
        ),
    )
    try:
        for _ in range(2):
            rig.follow(gateway, "alice").close()
        assert reads == ["sandbox ns/sb", "agent node-1"], "not remembered"
        where["ns/sb"] = "node-2"
        rig.follow(gateway, "alice").close()
        assert reads[2:] == ["sandbox ns/sb", "agent node-2"], reads
        agents.pop("node-2").shutdown()
        agents["node-2"] = agent_of_node("node-2")
        rig.follow(gateway, "alice").close()
        assert reads[4:] == ["sandbox ns/sb", "agent node-2"], reads
    finally:
        gateway.shutdown()
        for agent in agents.values():
            agent.shutdown()


def test_a_stream_ends_at_its_status_without_waiting_for_the_agents_close(rig: Rig) -> None:
    """Every agent stream ends with its status frame and a close. An agent that sends
    the status but holds its connection open (slow to close, or wedged): the user's
    stream still ends at the status, not at the gateway's idle timeout."""
    release = threading.Event()

    def status_then_hold(connection: ServerConnection) -> None:
        connection.send(encode_frame(STATUS, exit_status(0)))
        release.wait(30)

    agent = serve(
        status_then_hold,
        "127.0.0.1",
        0,
        ssl=server_context(
            str(rig.certs.agent("node-1").cert),
            str(rig.certs.agent("node-1").key),
            str(rig.certs.ca.cert),
        ),
        subprotocols=[Subprotocol("v5.channel.k8s.io")],
    )
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    gateway = rig.gateway(
        Sessions(4, 4),
        idle_timeout=60.0,
        backends=Backends(
            review=lambda _spec: {"allowed": True},
            node_of=lambda _ns, _name: "node-1",
            agent_of=lambda _node: ("127.0.0.1", int(agent.socket.getsockname()[1])),
        ),
    )
    try:
        user = rig.follow(gateway, "alice")
        assert decode_frame(bytes(user.recv(timeout=10)))[0] == STATUS  # type: ignore[arg-type]
        began = time.monotonic()
        with pytest.raises(ConnectionClosed):
            user.recv(timeout=10)
        assert time.monotonic() - began < 5, "the stream waited for the agent's close"
    finally:
        release.set()
        gateway.shutdown()
        agent.shutdown()


def test_an_upgrade_the_agent_lost_unanswered_is_tried_once_more_never_run_twice(
    rig: Rig,
) -> None:
    """The fault: the agent takes a connection and loses it before answering the
    upgrade. Lost before the agent took the stream, the gateway's second try under the
    same stream id is served; lost after, the second try is refused (409), since the
    agent may have started the first: a stream is never served twice."""

    class LosesItsAnswer(StreamServer):
        """An agent whose next ``lose`` upgrades are cut, ``after_taking`` or before."""

        lose, after_taking, taken = 0, False, 0

        def _admit(self, connection: ServerConnection, request: Any) -> Any:
            if self.lose and not self.after_taking:
                self.lose -= 1
                connection.socket.shutdown(socket.SHUT_RDWR)
                return None
            answer = super()._admit(connection, request)
            if answer is None:
                self.taken += 1
            if self.lose and self.after_taking:
                self.lose -= 1
                connection.socket.shutdown(socket.SHUT_RDWR)
            return answer

    agent = LosesItsAnswer(
        "node-1",
        bind="127.0.0.1",
        port=0,
        tls=server_context(
            str(rig.certs.agent("node-1").cert),
            str(rig.certs.agent("node-1").key),
            str(rig.certs.ca.cert),
        ),
        client_names=("sandlot-gateway",),
        sandbox=lambda key: SANDBOX if key == "ns/sb" else None,
        log_dir=str(rig.tmp / "logs"),
        execs=None,
        call_timeout=5.0,
        stop=threading.Event(),
    )
    agent.start()
    gateway = rig.gateway(
        Sessions(8, 8),
        backends=Backends(
            review=lambda _spec: {"allowed": True},
            node_of=lambda _namespace, _name: "node-1",
            agent_of=lambda _node: ("127.0.0.1", agent.port),
        ),
    )
    try:
        agent.lose, agent.after_taking = 1, False
        rig.follow(gateway, "alice").close()  # served by the second try
        assert agent.lose == 0 and agent.taken == 1, "the fault was not injected once"

        agent.lose, agent.after_taking = 1, True
        with pytest.raises(InvalidStatus) as refused:
            rig.follow(gateway, "alice")
        assert agent.lose == 0 and agent.taken == 2, "taken once, and only once"
        assert refused.value.response.status_code == 409
        assert b"opened already" in refused.value.response.body
    finally:
        gateway.shutdown()
        agent.shutdown()
