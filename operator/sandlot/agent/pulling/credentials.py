"""The registry credential for a sandbox's pull, from what this node may read.

Two sources, in the kubelet's order: the sandbox's own ``imagePullSecrets`` (in
the order listed), then the node-wide default (a ``.dockerconfigjson`` file the
chart mounts from one Secret). The agent never reads a tenant's Secret itself:
the operator copies the pull secrets of this node's sandboxes into this node's
brokered Secret (``sandlot-pull-<node>``, keys ``<namespace>.<name>``), which
only this node's agent identity may read (docs/isolation.md). A secret not yet
brokered (the operator is behind) is simply absent: the pull goes on with what is
there, and a refused credential is retried after its back-off.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandlot.adapters.pulling import Credential
from sandlot.adapters.pullsecrets import BrokeredData, brokered_key
from sandlot.policy.pulling import (
    SHARED_IDENTITY,
    ImageReference,
    credential_for,
    credential_identity,
)

log = logging.getLogger(__name__)


def _document(raw: bytes | str, what: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        log.warning("%s is not a .dockerconfigjson document: ignored", what)
        return None
    return parsed if isinstance(parsed, dict) else None


class Credentials:
    def __init__(self, brokered: BrokeredData | None, default_file: str = "") -> None:
        self._brokered = brokered
        self._default_file = default_file

    def _default(self) -> dict[str, Any] | None:
        if not self._default_file:
            return None
        try:
            raw = Path(self._default_file).read_bytes()
        except OSError as exc:
            log.warning("node-wide pull credentials %s unreadable: %s", self._default_file, exc)
            return None
        return _document(raw, self._default_file)

    def documents(
        self, sb: Mapping[str, Any], *, node_default: bool = True
    ) -> list[dict[str, Any]]:
        """The sandbox's pull secrets as brokered to this node, then the node default."""
        namespace = sb["metadata"]["namespace"]
        wanted = [
            str(ref.get("name"))
            for ref in (sb.get("spec") or {}).get("imagePullSecrets") or []
            if ref.get("name")
        ]
        documents: list[dict[str, Any]] = []
        data = self._brokered() if (wanted and self._brokered is not None) else None
        for name in wanted:
            value = (data or {}).get(brokered_key(namespace, name))
            if value is None:
                continue
            parsed = _document(base64.b64decode(value), f"pull secret {namespace}/{name}")
            if parsed is not None:
                documents.append(parsed)
        default = self._default() if node_default else None
        if default is not None:
            documents.append(default)
        return documents

    def lookup(self, sb: Mapping[str, Any], ref: ImageReference) -> Credential | None:
        return self.resolve(sb, ref)[0]

    def resolve(self, sb: Mapping[str, Any], ref: ImageReference) -> tuple[Credential | None, str]:
        """The credential for ``ref`` and its identity (``policy.pulling.credentials``): the
        sandbox's own, else the node-wide one or none, which share one identity."""
        own = credential_for(ref.registry, self.documents(sb, node_default=False))
        if own is not None:
            return Credential(*own), credential_identity(ref.registry, own)
        shared = credential_for(ref.registry, [d for d in [self._default()] if d is not None])
        return (Credential(*shared) if shared else None), SHARED_IDENTITY


__all__ = ["Credentials"]
