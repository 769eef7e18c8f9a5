"""Where the agent's registry requests may go, and what of an answer a tenant sees: pure.

An image reference is a URL a tenant chose, fetched from the node: without limits
it reaches the node's own ports, the link-local metadata service and anything a
redirect or a bearer-token realm points at (server-side request forgery). So:

- a connection to a loopback, link-local or unspecified address, or one of the
  node's own, is made only for a host listed in ``registry_private_hosts``
  (checked on the address each connection is made to, after DNS);
- a redirect is followed one hop at a time (at most ``MAX_REDIRECTS``), only to
  the registry's own host or one in ``registry_redirect_hosts``, never from https
  to http; the credential goes only to the registry's own host;
- a token realm is checked as a connection is (and never https to http);
- a status message says the HTTP status, its standard reason and error codes of
  the distribution spec from a fixed list, never the registry's own text.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

MAX_REDIRECTS = 5

DISTRIBUTION_CODES = frozenset(
    {
        "BLOB_UNKNOWN",
        "BLOB_UPLOAD_INVALID",
        "BLOB_UPLOAD_UNKNOWN",
        "DIGEST_INVALID",
        "MANIFEST_BLOB_UNKNOWN",
        "MANIFEST_INVALID",
        "MANIFEST_UNKNOWN",
        "MANIFEST_UNVERIFIED",
        "NAME_INVALID",
        "NAME_UNKNOWN",
        "SIZE_INVALID",
        "TAG_INVALID",
        "UNAUTHORIZED",
        "DENIED",
        "UNSUPPORTED",
        "TOOMANYREQUESTS",
    }
)
"""The error codes of the OCI distribution spec (and Docker's registry): all a
status message repeats of a registry's error body."""


def _normal(host: str) -> str:
    return host.strip("[]").lower()


def _listed(host: str, port: int | None, hosts: Iterable[str]) -> bool:
    """``host`` or ``host:port`` is in ``hosts`` (entries as ``host``, ``host:port``,
    ``[v6]`` or ``[v6]:port``)."""
    name = _normal(host)
    wanted = {name, f"{name}:{port}", f"[{name}]:{port}"} if port else {name}
    return any(_normal(entry) in wanted or entry.lower() in wanted for entry in hosts)


@dataclass(frozen=True)
class RegistryAccess:
    """Where registry requests may go; the defaults allow no private address and no
    redirect off the registry's host."""

    private_hosts: frozenset[str] = frozenset()
    """Hosts (``name`` or ``name:port``) that may resolve to loopback, link-local,
    unspecified or node addresses."""
    redirect_hosts: frozenset[str] = frozenset()
    """Hosts besides the registry's own that a redirect may go to (blob storage)."""
    node_addresses: frozenset[str] = frozenset()
    """The node's own addresses."""


def private_kind(address: str, node_addresses: Iterable[str] = ()) -> str | None:
    """What makes ``address`` private to the node (``loopback`` ...), or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_unspecified:
        return "unspecified"
    own = set()
    for node in node_addresses:
        try:
            own.add(ipaddress.ip_address(node.split("%", 1)[0]))
        except ValueError:
            continue
    if ip in own:
        return "one of the node's own"
    return None


def address_refusal(
    host: str, port: int | None, address: str, access: RegistryAccess
) -> str | None:
    """Why a connection to ``host`` at ``address`` is refused, or None."""
    kind = private_kind(address, access.node_addresses)
    if kind is None or _listed(host, port, access.private_hosts):
        return None
    return (
        f"{host} resolves to {address}, {kind} address; a registry there is used only "
        "if its host is listed in registry_private_hosts"
    )


def _port(scheme: str, port: int | None) -> int:
    return port if port is not None else (443 if scheme == "https" else 80)


def same_host(url: str, other: str) -> bool:
    """``url`` and ``other`` name the same host and port (scheme default ports filled)."""
    a, b = urlsplit(url), urlsplit(other)
    return (_normal(a.hostname or ""), _port(a.scheme, a.port)) == (
        _normal(b.hostname or ""),
        _port(b.scheme, b.port),
    )


def redirect_refusal(
    current: str, target: str, registry: str, access: RegistryAccess, hops: int
) -> str | None:
    """Why following a redirect from ``current`` to ``target`` is refused, or None;
    ``registry``: the registry endpoint's URL; ``hops``: redirects followed so far."""
    if hops >= MAX_REDIRECTS:
        return f"more than {MAX_REDIRECTS} redirects"
    parts = urlsplit(target)
    # The messages name nothing of the target: it is the registry's text.
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "a redirect to something not an http(s) URL"
    if urlsplit(current).scheme == "https" and parts.scheme == "http":
        return "a redirect from https to http"
    if same_host(target, registry) or _listed(parts.hostname, parts.port, access.redirect_hosts):
        return None
    return "a redirect to a host neither the registry's own nor listed in registry_redirect_hosts"


def realm_refusal(realm: str, registry: str) -> str | None:
    """Why a bearer-token realm is refused before any connection, or None (its address
    is then checked as every connection's is)."""
    parts = urlsplit(realm)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the token realm is not an http(s) URL"
    if urlsplit(registry).scheme == "https" and parts.scheme == "http":
        return "the token realm is plain http for an https registry"
    return None


def status_message(status: int, body: bytes = b"") -> str:
    """``HTTP 401 Unauthorized (UNAUTHORIZED)``: the status, its standard reason and
    the spec's error codes the body names, nothing else of it."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    codes: list[str] = []
    try:
        for error in json.loads(body).get("errors") or []:
            code = error.get("code") if isinstance(error, dict) else None
            if code in DISTRIBUTION_CODES and code not in codes:
                codes.append(code)
    except (ValueError, AttributeError, TypeError):
        pass
    text = f"HTTP {status}" + (f" {reason}" if reason else "")
    return text + (f" ({', '.join(codes)})" if codes else "")


__all__ = [
    "DISTRIBUTION_CODES",
    "MAX_REDIRECTS",
    "RegistryAccess",
    "address_refusal",
    "private_kind",
    "realm_refusal",
    "redirect_refusal",
    "same_host",
    "status_message",
]
