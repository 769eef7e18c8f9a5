"""The agent's own serving certificate for its stream server, asked of sandlot's
operator (``adapters.agentcerts``) at start and again before it expires.

The key is made here, on the node, and written only to the agent's own files; the
certificate names this node alone, so the gateway, which dials a sandbox's agent by
the sandbox's node, refuses it anywhere else. Renewal is timed on the agent's
monotonic clock from when the certificate arrived (``policy.agentcerts.renew_after``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sandlot.adapters.agentcerts import CertificateRefused, request_certificate
from sandlot.adapters.startup import StartupError, setting_name
from sandlot.agent.settings import AgentSettings
from sandlot.policy.agentcerts import renew_after

log = logging.getLogger(__name__)


class StreamIdentity:
    """``obtain()`` once before the stream server loads its files; ``renew_if_due()``
    from the loop that reloads them."""

    def __init__(
        self,
        api: Any,
        settings: AgentSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.node = settings.node_name
        self.cert_path = settings.stream_tls_cert
        self.key_path = settings.stream_tls_key
        self.timeout = settings.stream_tls_request_timeout.total_seconds()
        self.clock = clock
        self.due = 0.0  # monotonic time of the next request

    def _request(self) -> None:
        cert = request_certificate(
            self.api, self.node, self.cert_path, self.key_path, timeout=self.timeout
        )
        lifetime = renew_after(
            cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
        )
        self.due = self.clock() + lifetime

    def obtain(self) -> None:
        try:
            self._request()
        except (CertificateRefused, TimeoutError, OSError) as e:
            raise StartupError(
                f"{setting_name('stream_tls_request')}: no stream certificate for node "
                f"{self.node}: {e}"
            ) from None

    def renew_if_due(self) -> None:
        """Ask for the next certificate once the current one is two thirds through its
        life; a failure keeps the current one and asks again on the next call."""
        if self.clock() < self.due:
            return
        try:
            self._request()
        except Exception as e:
            log.warning("renewing node %s's stream certificate failed: %s", self.node, e)


__all__ = ["StreamIdentity"]
