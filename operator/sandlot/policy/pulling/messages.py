"""A pull failure as a Sandbox's status says it: pure.

A registry connection error names what the node resolved and dialled: ``dial tcp
10.0.3.7:5000: connect: connection refused``, a mirror's URL, urllib3's
``HTTPSConnectionPool(host=..., port=...)``. A tenant reading its Sandbox learns from
that the cluster's internal addresses, and, pointing ``spec.image`` at names of its
choosing, could map them. So the status keeps the registry host as the user named it
and drops every other address and port; the agent's log keeps the whole message.
"""

from __future__ import annotations

import ipaddress
import re

HIDDEN = "[address]"
"""What stands where an address was."""

_NAMED = "\x00named\x00"
_BRACKETED_V6 = re.compile(r"\[([0-9A-Fa-f:.%\w]+)\](?::\d{1,5})?")
_V4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?::\d{1,5})?(?![\w.])")
_V6 = re.compile(r"(?<![\w:.])([0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7})(?![\w:])")
_HOST_PORT = re.compile(r"(?<![\w.-])((?:[A-Za-z0-9-]+\.)+[A-Za-z0-9-]+|localhost):(\d{1,5})(?!\d)")
_PORT_ARG = re.compile(r",?\s*port=\d{1,5}")


def _address(match: re.Match[str]) -> str:
    try:
        ipaddress.ip_address(match.group(1).split("%", 1)[0])
    except ValueError:
        return match.group(0)
    return HIDDEN


def public_message(message: str, registry: str) -> str:
    """``message`` without the addresses and ports a tenant did not write: the
    ``registry`` it named (``docker.io``, ``registry.example:5000``) stays as named."""
    named = re.compile(
        rf"(?<![\w.-]){re.escape(registry)}(?![\w-]|\.[\w-]|:\d)", flags=re.IGNORECASE
    )
    text = named.sub(_NAMED, message) if registry else message
    text = _BRACKETED_V6.sub(_address, text)
    text = _V4.sub(_address, text)
    text = _V6.sub(_address, text)
    text = _HOST_PORT.sub(lambda m: m.group(1), text)
    text = _PORT_ARG.sub("", text)
    return text.replace(_NAMED, registry)


__all__ = ["HIDDEN", "public_message"]
