"""The operator's answer to agents' certificate requests: each one as it is seen,
and every pending one again every ``SWEEP`` seconds, so a request seen while this
replica was a standby (or by a leader that died) is answered by the next leader."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import kopf

from sandlot.adapters.agentcerts import AgentCsrSigner
from sandlot.api.keys import AGENT_SIGNER
from sandlot.controllers.kopfhandlers import run_while_operating

log = logging.getLogger(__name__)

SWEEP = 30.0  # seconds between looks at every pending request


def register(
    registry: kopf.OperatorRegistry, signer: AgentCsrSigner, leading: Callable[[], bool]
) -> None:
    """Add the handlers answering sandlot's CertificateSigningRequests to ``registry``."""

    async def answer(body: Any) -> None:
        if not leading():
            return
        try:
            await asyncio.to_thread(signer.answer, body)
        except Exception as e:  # the sweep tries again
            log.warning("certificate request %s: %s", body["metadata"]["name"], e)

    @kopf.on.event(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        field="spec.signerName",
        value=AGENT_SIGNER,
        registry=registry,
    )
    async def agent_csr_event(body: kopf.Body, **kwargs: Any) -> None:
        if kwargs.get("type") != "DELETED":
            await answer(dict(body))

    async def sweep() -> None:
        while True:
            await asyncio.sleep(SWEEP)
            if not leading():
                continue
            try:
                pending = await asyncio.to_thread(signer.pending)
            except Exception as e:
                log.warning("cannot list the agents' certificate requests: %s", e)
                continue
            for body in pending:
                await answer(body)

    run_while_operating(registry, sweep, name="agent_csr_sweep")


__all__ = ["register"]
