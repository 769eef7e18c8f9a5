"""Certificates rotate without a restart: a server whose certificate files are
replaced serves the new certificate on its next handshake and trusts a new CA beside
the old one, over real TLS on loopback (``adapters.mtls.ReloadingTls``, used by the
agent's stream server and the gateway)."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.adapters.mtls import ReloadingTls, server_context
from sandlot.devtools.certs import CA, Pair

pytestmark = pytest.mark.integration


def _serve(ctx: ssl.SSLContext, stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def loop() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with ctx.wrap_socket(raw, server_side=True) as conn:
                    conn.sendall(b"ok")
            except (ssl.SSLError, OSError):
                raw.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return listener, thread


def _hello(port: int, trust: Path, client: Pair) -> str:
    ctx = ssl.create_default_context(cafile=str(trust))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="sandlot-agent") as conn,
        ):
            return conn.recv(2).decode()
    except (ssl.SSLError, OSError) as e:
        return f"refused: {e}"


@pytest.fixture
def cas(tmp_path: Path) -> Iterator[tuple[CA, CA]]:
    yield CA.create(tmp_path / "old", "old-ca"), CA.create(tmp_path / "new", "new-ca")


def test_a_rotated_certificate_and_ca_are_used_without_a_restart(
    tmp_path: Path, cas: tuple[CA, CA]
) -> None:
    old, new = cas
    live = tmp_path / "live"
    live.mkdir()
    served = old.issue(tmp_path / "old", "sandlot-agent", dns=("sandlot-agent",))
    cert, key, ca = live / "tls.crt", live / "tls.key", live / "ca.crt"
    shutil.copy(served.cert, cert)
    shutil.copy(served.key, key)
    shutil.copy(old.cert, ca)
    ctx = server_context(str(cert), str(key), str(ca))
    files = ReloadingTls(ctx, str(cert), str(key), [str(ca)])
    old_client = old.issue(tmp_path / "old", "sandlot-gateway")
    new_client = new.issue(tmp_path / "new", "sandlot-gateway")
    stop = threading.Event()
    listener, thread = _serve(ctx, stop)
    port = listener.getsockname()[1]
    try:
        assert _hello(port, old.cert, old_client) == "ok"
        assert _hello(port, new.cert, new_client).startswith("refused"), "new CA trusted early"
        assert files.refresh() is False, "nothing changed yet"
        # The rotation, as a mounted Secret changes: new leaf, both CAs in the bundle.
        rotated = new.issue(tmp_path / "new", "sandlot-agent", dns=("sandlot-agent",))
        shutil.copy(rotated.cert, cert)
        shutil.copy(rotated.key, key)
        ca.write_bytes(old.cert.read_bytes() + new.cert.read_bytes())
        assert files.refresh() is True
        assert _hello(port, new.cert, new_client) == "ok", "the new certificate is served"
        assert _hello(port, new.cert, old_client) == "ok", "the old CA's clients still pass"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_files_caught_half_written_keep_the_old_certificate(
    tmp_path: Path, cas: tuple[CA, CA]
) -> None:
    old, new = cas
    served = old.issue(tmp_path / "old", "sandlot-agent", dns=("sandlot-agent",))
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    shutil.copy(served.cert, cert)
    shutil.copy(served.key, key)
    ctx = server_context(str(cert), str(key), str(old.cert))
    files = ReloadingTls(ctx, str(cert), str(key), [str(old.cert)])
    other = new.issue(tmp_path / "new", "sandlot-agent", dns=("sandlot-agent",))
    shutil.copy(other.cert, cert)  # the key is not there yet
    assert files.refresh() is False
    stop = threading.Event()
    listener, thread = _serve(ctx, stop)
    try:
        client = old.issue(tmp_path / "old", "sandlot-gateway")
        assert _hello(listener.getsockname()[1], old.cert, client) == "ok"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
