"""The gateway listens where its settings say: every address when ``bind`` is empty
(the chart's default), as a real server socket, with its real TLS files."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from sandlot.adapters.mtls import client_context, server_context
from sandlot.devtools.certs import StreamCerts
from sandlot.gateway.server import Backends, Gateway, Refusal, Sessions
from sandlot.policy.streamaccess import RequestHeaderConfig

pytestmark = pytest.mark.integration


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
            str(certs.ca.cert), str(certs.gateway.cert), str(certs.gateway.key)
        ),
        agent_server_name="sandlot-agent",
        requestheader=RequestHeaderConfig,
        backends=Backends(review=_nowhere, node_of=_nowhere, agent_of=_nowhere),  # type: ignore[arg-type]
        sessions=Sessions(4, 2),
        call_timeout=5.0,
    )
    gateway.start()
    try:
        ctx = ssl.create_default_context(cafile=str(certs.ca.cert))
        ctx.load_cert_chain(str(certs.agent.cert), str(certs.agent.key))
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
