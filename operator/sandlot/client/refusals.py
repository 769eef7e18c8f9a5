"""The SDK's error for an API server's refusal, for every kind it acts on."""

from __future__ import annotations

from sandlot.adapters.sandboxapi import ApiRefused
from sandlot.client.errors import Forbidden, SandboxNotFound, SandlotError


def refusal(e: ApiRefused, namespace: str, name: str, what: str = "sandbox") -> SandlotError:
    """The SDK's error for an API server refusal about ``what`` ``name``."""
    if e.status in (401, 403):
        return Forbidden(e.message, e.status)
    if e.status == 404:
        return SandboxNotFound(namespace, name, what)
    return SandlotError(
        f"{what} {namespace}/{name}: the API server answered {e.status}: {e.message}"
    )


__all__ = ["refusal"]
