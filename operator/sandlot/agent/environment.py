"""A sandbox's environment from the copy brokered to this node.

``env[].valueFrom`` and ``envFrom`` name Secrets and ConfigMaps in the sandbox's
namespace. The agent never reads them itself: the operator copies the keys this
node's sandboxes use into the node's brokered Secret (``sandlot-pull-<node>``,
keys ``_<kind>.<namespace>.<name>``), readable by this node's identity alone
(docs/isolation.md), and the agent resolves the variables from it as the kubelet
does (``policy.envrefs``). A missing object or key, or one not brokered yet,
raises ``EnvReferenceMissing``: the start waits (CreateContainerConfigError).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sandlot.adapters.pullsecrets import BrokeredData, reference_key
from sandlot.agent.status import StatusWriter
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase, SandboxSpec
from sandlot.policy.agentsync import UNSTARTED_PHASES
from sandlot.policy.envrefs import (
    EnvReferenceMissing,
    ObjectKey,
    Referenced,
    decode,
    resolve,
    wanted_keys,
)

log = logging.getLogger(__name__)


def references(spec: SandboxSpec) -> bool:
    """Whether the spec's environment names any Secret or ConfigMap."""
    return bool(spec.env_from) or any(e.value_from is not None for e in spec.env)


class Environment:
    def __init__(self, brokered: BrokeredData) -> None:
        self._brokered = brokered

    def variables(self, namespace: str, spec: SandboxSpec) -> list[str]:
        """``NAME=value`` of every variable of the spec, references resolved."""
        objects: dict[ObjectKey, Referenced | None] = {}
        wanted = wanted_keys(spec.env, spec.env_from)
        data = (self._brokered() or {}) if wanted else {}
        for kind, name in wanted:
            value = data.get(reference_key(namespace, kind, name))
            objects[(kind, name)] = decode(value) if value is not None else None
        return [f"{k}={v}" for k, v in resolve(namespace, spec.env, spec.env_from, objects)]

    def for_start(
        self, status: StatusWriter, sb: Mapping[str, Any], spec: SandboxSpec
    ) -> tuple[bool, list[str] | None]:
        """(ready, variables) for a start: None without references (the spec's plain
        values are used); not ready when one is missing, after saying so in its status."""
        if not references(spec):
            return True, None
        try:
            return True, self.variables(sb["metadata"]["namespace"], spec)
        except EnvReferenceMissing as exc:
            hold_for_config(status, sb, str(exc))
            return False, None


def hold_for_config(status: StatusWriter, sb: Mapping[str, Any], message: str) -> None:
    """Keep the sandbox Scheduled, saying which object or key it waits for (once:
    the same words are not written again at every pass)."""
    current = sb.get("status") or {}
    if (
        current.get("phase") == SandboxPhase.SCHEDULED
        and current.get("reason") == SandboxReason.CREATE_CONTAINER_CONFIG_ERROR
        and current.get("message") == message
    ):
        return
    log.info(
        "sandbox %s/%s waits: %s", sb["metadata"]["namespace"], sb["metadata"]["name"], message
    )
    body = {
        "phase": SandboxPhase.SCHEDULED.value,
        "reason": SandboxReason.CREATE_CONTAINER_CONFIG_ERROR.value,
        "message": message,
    }
    status.write(sb, body, allowed_from=UNSTARTED_PHASES)


__all__ = ["Environment", "hold_for_config", "references"]
