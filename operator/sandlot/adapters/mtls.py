"""TLS contexts for the stream path, and who is on the other end of a connection.

Two hops carry a user's stream, and each is mutual TLS: the API server's front
proxy to the stream gateway (the gateway believes the user named in the request's
headers only from a client certificate the front-proxy CA signed), and the gateway
to a node's agent (the agent accepts only a client certificate of sandlot's stream
CA whose common name is the gateway's; the gateway checks the agent's serving
certificate against the same CA). Plain HTTP and certificate-less clients never get
past the handshake.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def server_context(cert: str, key: str, client_ca: str | Sequence[str]) -> ssl.SSLContext:
    """A server context that demands a client certificate signed by ``client_ca``
    (one PEM file, or several: more can be added later with ``trust``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # trusts nothing until told: no system CAs
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    # No TLS 1.3 session tickets: nobody resumes these sessions, and a ticket that
    # reaches a client after its handshake is processed by its reading thread in
    # OpenSSL's handshake state, which a concurrent write on another thread (a
    # websockets request, a stdin frame) then races: the write was lost and the
    # stream hung until its open timeout.
    ctx.num_tickets = 0
    for path in [client_ca] if isinstance(client_ca, str) else client_ca:
        ctx.load_verify_locations(cafile=path)
    return ctx


def trust(ctx: ssl.SSLContext, ca_pem: str) -> None:
    """Add the CA certificates in ``ca_pem`` (PEM text) to what ``ctx`` verifies
    against: a rotated CA is trusted beside the old one, with no restart."""
    ctx.load_verify_locations(cadata=ca_pem)


def client_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """A client context presenting ``cert`` and verifying the server (its name
    included) against ``ca`` alone."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies peer and name; no system CAs
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=ca)
    ctx.load_cert_chain(cert, key)
    return ctx


def read_files(paths: Sequence[str]) -> tuple[bytes, ...]:
    """The bytes of each file, b"" for one that cannot be read: what is compared to
    tell that TLS files changed (a file missing mid-rotation is a change too)."""
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError:
            out.append(b"")
    return tuple(out)


class ReloadingTls:
    """A context whose certificate, key and CAs are read again from their files when
    those change (a mounted Secret rotated by Kubernetes, cert-manager or a person):
    new handshakes use the new certificate at once; a new CA is trusted beside the old
    ones, so a rotation has no moment where either side refuses the other."""

    def __init__(self, ctx: ssl.SSLContext, cert: str, key: str, cas: Sequence[str]) -> None:
        self.ctx, self.cert, self.key, self.cas = ctx, cert, key, tuple(cas)
        self._seen = self._read()

    def _read(self) -> tuple[bytes, ...]:
        return read_files((self.cert, self.key, *self.cas))

    def refresh(self) -> bool:
        """Reload if the files changed; True when they were. Files caught half-written
        (a key that does not match its certificate yet) leave the old ones in use."""
        current = self._read()
        if current == self._seen:
            return False
        try:
            # A failed load leaves a context half-changed (the new certificate beside
            # the old key), so the pair is tried on a scratch context first.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert, self.key)
            self.ctx.load_cert_chain(self.cert, self.key)
            for ca in self.cas:
                self.ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            log.warning("TLS files %s changed but do not load yet: %s", self.cert, e)
            return False
        self._seen = current
        log.info("TLS files reloaded: %s", self.cert)
        return True


def serving_context(cert: str, key: str, ca_pem: str) -> ssl.SSLContext:
    """A server context (``server_context``'s) trusting exactly the CAs in
    ``ca_pem`` (PEM text) for client certificates."""
    ctx = server_context(cert, key, [])
    trust(ctx, ca_pem)
    return ctx


def hand_new_connections_to(listener: Any, ctx: ssl.SSLContext) -> None:
    """Make the listening TLS socket ``listener`` wrap the connections it accepts
    from now on with ``ctx``; open ones keep theirs. An ``SSLContext`` can add a CA
    but never drop one, so a CA that must stop being trusted needs a new context.
    CPython's ``SSLSocket.accept`` wraps each connection with the listener's
    ``_context``, which the public ``context`` setter cannot change on a socket with
    no TLS session of its own: this is the one place that reaches it."""
    if not isinstance(listener, ssl.SSLSocket):
        raise TypeError(f"not a TLS listener: {listener!r}")
    listener._context = ctx  # type: ignore[attr-defined]


def peer_common_name(sock: Any) -> str:
    """The common name of the verified client certificate on ``sock``; empty when
    there is none (or ``sock`` is not TLS)."""
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return ""
    cert = getpeercert() or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def peer_dns_names(sock: Any) -> tuple[str, ...]:
    """The DNS names of the verified certificate of the peer on ``sock``."""
    getpeercert = getattr(sock, "getpeercert", None)
    cert = (getpeercert() if getpeercert else None) or {}
    return tuple(str(v) for k, v in cert.get("subjectAltName", ()) if k == "DNS")


__all__ = [
    "ReloadingTls",
    "client_context",
    "hand_new_connections_to",
    "peer_common_name",
    "peer_dns_names",
    "read_files",
    "server_context",
    "serving_context",
    "trust",
]
