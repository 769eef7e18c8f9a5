"""policy.pulling.access: which addresses, redirects and realms a registry request
may reach, and what of a registry's answer a status message repeats."""

from __future__ import annotations

import pytest

from sandlot.policy.pulling.access import (
    MAX_REDIRECTS,
    RegistryAccess,
    address_refusal,
    realm_refusal,
    redirect_refusal,
    status_message,
)

NONE = RegistryAccess(node_addresses=frozenset({"10.0.0.7"}))
LISTED = RegistryAccess(
    private_hosts=frozenset({"127.0.0.1", "reg.internal:5000", "[fe80::1]"}),
    redirect_hosts=frozenset({"blobs.example"}),
    node_addresses=frozenset({"10.0.0.7"}),
)


@pytest.mark.parametrize(
    ("host", "port", "address", "access", "refused"),
    [
        ("reg.example", 443, "93.184.216.34", NONE, None),
        ("reg.example", 443, "127.0.0.1", NONE, "loopback"),
        ("reg.example", 443, "::ffff:127.0.0.1", NONE, "loopback"),
        ("reg.example", 443, "169.254.169.254", NONE, "link-local"),
        ("reg.example", 443, "fe80::1%lo", NONE, "link-local"),
        ("reg.example", 443, "0.0.0.0", NONE, "unspecified"),
        ("reg.example", 443, "10.0.0.7", NONE, "node's own"),
        ("127.0.0.1", 5000, "127.0.0.1", LISTED, None),
        ("reg.internal", 5000, "127.0.0.2", LISTED, None),
        ("reg.internal", 5001, "127.0.0.2", LISTED, "loopback"),
        ("fe80::1", 80, "fe80::1%lo", LISTED, None),
        ("evil.example", 443, "169.254.169.254", LISTED, "link-local"),
    ],
    ids=[
        "public",
        "loopback",
        "mapped-loopback",
        "metadata",
        "v6-link-local",
        "unspecified",
        "node-address",
        "listed-host",
        "listed-host-and-port",
        "listed-host-other-port",
        "listed-v6",
        "listing-one-host-allows-no-other",
    ],
)
def test_private_addresses_only_for_listed_hosts(
    host: str, port: int, address: str, access: RegistryAccess, refused: str | None
) -> None:
    why = address_refusal(host, port, address, access)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why and "registry_private_hosts" in why


REG = "https://reg.example"


@pytest.mark.parametrize(
    ("current", "target", "hops", "refused"),
    [
        (f"{REG}/v2/x", f"{REG}/v2/y", 0, None),
        (f"{REG}/v2/x", "https://reg.example:443/v2/y", 0, None),
        (f"{REG}/v2/x", "https://blobs.example/b", 0, None),
        (f"{REG}/v2/x", "https://other.example/b", 0, "registry_redirect_hosts"),
        (f"{REG}/v2/x", "http://reg.example/v2/y", 0, "https to http"),
        (f"{REG}/v2/x", "file:///etc/passwd", 0, "not an http(s) URL"),
        (f"{REG}/v2/x", f"{REG}/v2/y", MAX_REDIRECTS, "more than 5 redirects"),
    ],
    ids=["same-host", "same-host-default-port", "listed", "other", "downgrade", "file", "too-many"],
)
def test_redirects_only_to_the_registry_or_listed_hosts(
    current: str, target: str, hops: int, refused: str | None
) -> None:
    why = redirect_refusal(current, target, REG, LISTED, hops)
    assert (why is None) if refused is None else (why is not None and refused in why)


def test_realm_must_be_http_and_not_a_downgrade() -> None:
    assert realm_refusal("https://auth.example/token", REG) is None
    assert realm_refusal("http://auth.example/token", "http://127.0.0.1:5000") is None
    assert "plain http" in (realm_refusal("http://auth.example/token", REG) or "")
    assert "not an http(s) URL" in (realm_refusal("gopher://x/", REG) or "")


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (
            401,
            b'{"errors":[{"code":"UNAUTHORIZED","message":"go to evil.example"}]}',
            "HTTP 401 Unauthorized (UNAUTHORIZED)",
        ),
        (
            404,
            b'{"errors":[{"code":"MANIFEST_UNKNOWN"},{"code":"NAME_UNKNOWN"}]}',
            "HTTP 404 Not Found (MANIFEST_UNKNOWN, NAME_UNKNOWN)",
        ),
        (500, b'{"errors":[{"code":"<script>","message":"x"}]}', "HTTP 500 Internal Server Error"),
        (502, b"<html>proxy says hello</html>", "HTTP 502 Bad Gateway"),
        (599, b"", "HTTP 599"),
    ],
    ids=["code-kept-text-dropped", "two-codes", "unknown-code", "html", "unknown-status"],
)
def test_status_messages_carry_no_registry_text(status: int, body: bytes, message: str) -> None:
    assert status_message(status, body) == message
