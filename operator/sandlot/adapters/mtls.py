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

import ssl
from collections.abc import Sequence
from typing import Any


def server_context(cert: str, key: str, client_ca: str | Sequence[str]) -> ssl.SSLContext:
    """A server context that demands a client certificate signed by ``client_ca``
    (one PEM file, or several: more can be added later with ``trust``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # trusts nothing until told: no system CAs
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
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


__all__ = ["client_context", "peer_common_name", "server_context", "trust"]
