"""kopf's own HTTP client, with a bound on its connections.

kopf's built-in session opens a connection for every request in flight (an
``aiohttp.TCPConnector`` with ``limit=0``). On a first install kopf adds its
finalizer to every SandboxNode as it first sees it, all at once, so the first
operator of a large fleet opens hundreds of TLS connections to the API server at
once, and each connection's buffers stay in the heap after it closes: that operator
holds far more memory than the next one, which finds the finalizers in place (the
figures: docs/measurements.md, "Memory").

The login handler hands kopf this session instead: the same server, CA, client
certificate and token as ``ConnectionInfo`` would give it, over at most
``KOPF_CONNECTIONS`` connections. kopf's watches hold one each (four kinds); its
patches share the rest, and queue for a free connection rather than open another.
kopf closes the session itself when it logs in again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

KOPF_CONNECTIONS = 32


def kopf_session(
    connection: Mapping[str, Any], limit: int = KOPF_CONNECTIONS
) -> kopf.AiohttpSession:
    """kopf's login answer for ``connection`` (``kube.connection_params``): a session
    of at most ``limit`` connections. Call it on the event loop (an async handler)."""
    if limit < 1:
        raise ValueError(f"kopf's connection limit must be at least 1, got {limit}")
    info = kopf.ConnectionInfo(**connection)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        server=info.server,
        priority=info.priority,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        aiohttp_session=session,
    )
