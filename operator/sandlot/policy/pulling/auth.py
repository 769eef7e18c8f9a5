"""Which credential of a set of ``.dockerconfigjson`` documents serves a registry: pure.

The kubelet's reading: each document's ``auths`` maps a registry (a host, a URL
with a scheme or a path, or Docker Hub's historical ``https://index.docker.io/v1/``)
to ``auth`` (base64 of ``user:password``) or ``username`` and ``password``. The
first document that names the registry wins, as the kubelet tries pull secrets in
the order the pod lists them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

DOCKER_HUB_KEYS = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def _host(key: str) -> str:
    if "://" in key:
        key = urlsplit(key).netloc
    return key.partition("/")[0]


def _matches(key: str, registry: str) -> bool:
    host = _host(key)
    if registry == "docker.io":
        return host in DOCKER_HUB_KEYS
    return host == registry


def _decode(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    if entry.get("username") and entry.get("password") is not None:
        return str(entry["username"]), str(entry["password"])
    auth = entry.get("auth")
    if not isinstance(auth, str) or not auth:
        return None
    try:
        user, sep, password = base64.b64decode(auth).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


def credential_for(registry: str, documents: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """``(username, password)`` for ``registry`` (as named in the image reference),
    or None when no document has one."""
    for document in documents:
        auths = document.get("auths")
        if not isinstance(auths, Mapping):
            continue
        for key, entry in auths.items():
            if isinstance(entry, Mapping) and _matches(str(key), registry):
                found = _decode(entry)
                if found is not None:
                    return found
    return None


__all__ = ["credential_for"]
