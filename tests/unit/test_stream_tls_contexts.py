"""The SDK's TLS context for streams (``adapters.streamclient``): made once per
kubeconfig TLS settings and reused while the files it was made from are unchanged;
a changed file or another client certificate gets its own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sandlot.adapters import streamclient
from sandlot.devtools.certs import StreamCerts


def config(ca: Path, cert: Path | None = None, key: Path | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        host="https://127.0.0.1:6443",
        verify_ssl=True,
        ssl_ca_cert=str(ca),
        cert_file=str(cert) if cert else None,
        key_file=str(key) if key else None,
    )


def test_a_context_is_reused_until_a_file_changes(tmp_path: Path) -> None:
    certs = StreamCerts.create(tmp_path / "certs", "sandlot-system")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(certs.ca.cert.read_bytes())
    first = streamclient._tls(config(ca))
    assert first is not None
    assert streamclient._tls(config(ca)) is first
    ca.write_bytes(certs.ca.cert.read_bytes() + certs.agent_ca.cert.read_bytes())  # rotated
    assert streamclient._tls(config(ca)) is not first


def test_another_client_certificate_never_shares_a_context(tmp_path: Path) -> None:
    """A context presents its client certificate: a kubeconfig of another identity
    never connects with it."""
    certs = StreamCerts.create(tmp_path / "certs", "sandlot-system")
    one = certs.ca.issue(tmp_path / "one", "alice")
    two = certs.ca.issue(tmp_path / "two", "bob")
    alice = streamclient._tls(config(certs.ca.cert, one.cert, one.key))
    bob = streamclient._tls(config(certs.ca.cert, two.cert, two.key))
    assert alice is not None and bob is not None and alice is not bob


def test_plain_http_has_no_context() -> None:
    cfg = SimpleNamespace(host="http://127.0.0.1:8080")
    assert streamclient._tls(cfg) is None
