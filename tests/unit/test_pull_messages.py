"""What a pull failure tells the tenant in its Sandbox's status
(sandlot.policy.pulling.messages): the registry as the user named it, no address or
port of the cluster's."""

from __future__ import annotations

import pytest

from sandlot.policy.pulling import public_message

CASES = [
    (
        "GET https://registry.example/v2/app/manifests/1: dial tcp 10.0.3.7:443: connect: "
        "connection refused",
        "registry.example",
        "GET https://registry.example/v2/app/manifests/1: dial tcp [address]: connect: "
        "connection refused",
    ),
    (
        "GET https://registry.example:443/v2/: HTTPSConnectionPool(host='registry.example', "
        "port=443): Max retries exceeded (Caused by NewConnectionError('Failed to establish "
        "a new connection: [Errno 111] Connection refused'))",
        "registry.example",
        "GET https://registry.example/v2/: HTTPSConnectionPool(host='registry.example'): "
        "Max retries exceeded (Caused by NewConnectionError('Failed to establish a new "
        "connection: [Errno 111] Connection refused'))",
    ),
    (
        "GET http://mirror.internal:5000/v2/app/manifests/1: timed out",
        "registry.example",
        "GET http://mirror.internal/v2/app/manifests/1: timed out",
    ),
    (
        "failed to resolve: dial tcp [fd00:10::7]:5000: i/o timeout",
        "registry.example",
        "failed to resolve: dial tcp [address]: i/o timeout",
    ),
    (
        "dial tcp fd00:10::7 port 5000: no route to host",
        "registry.example",
        "dial tcp [address] port 5000: no route to host",
    ),
    (
        "GET http://127.0.0.1:5000/v2/app/manifests/1: HTTP 404 Not Found (MANIFEST_UNKNOWN)",
        "127.0.0.1:5000",
        "GET http://127.0.0.1:5000/v2/app/manifests/1: HTTP 404 Not Found (MANIFEST_UNKNOWN)",
    ),
    (
        "GET https://registry.example:5000/v2/: dial tcp 192.168.1.9:5000: refused",
        "registry.example:5000",
        "GET https://registry.example:5000/v2/: dial tcp [address]: refused",
    ),
    (
        "blob sha256:4f5e: the registry sent content of digest sha256:9a8b at 04:20:08",
        "docker.io",
        "blob sha256:4f5e: the registry sent content of digest sha256:9a8b at 04:20:08",
    ),
]


@pytest.mark.parametrize(
    ("message", "registry", "shown"),
    CASES,
    ids=[
        "resolved-ipv4-and-port",
        "urllib3-pool-port",
        "a-mirrors-port",
        "bracketed-ipv6",
        "bare-ipv6",
        "the-named-loopback-registry-stays",
        "the-named-port-stays-the-resolved-address-goes",
        "digests-and-times-untouched",
    ],
)
def test_a_status_message_keeps_the_named_registry_and_drops_internal_addresses(
    message: str, registry: str, shown: str
) -> None:
    assert public_message(message, registry) == shown
