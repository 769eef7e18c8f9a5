"""API calls of the agent-sandbox controller (``controllers.agentsandbox``).

Answers in the controller's terms: an object or None (gone), created or taken (a
409: the name is someone's already), deleted or not. Deletes carry the uid they
were decided on, so an object recreated under the same name meanwhile is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects, answer_unless, delete_exact, patch_custom_status
from sandlot.api.agentsandbox import (
    AGENT_SANDBOX_VERSION,
    AGENTS_GROUP,
    COMPAT_CLAIMS,
    COMPAT_SANDBOXES,
    EXTENSIONS_GROUP,
    TEMPLATES,
    WARM_POOLS,
)
from sandlot.api.common import CLAIMS, GROUP, POOLS, SANDBOXES, VERSION
from sandlot.api.keys import CLAIM_LABEL
from sandlot.policy.agentsandbox import claim_env

# (group, version, plural) of each kind this controller touches.
Kind = tuple[str, str, str]
TEMPLATE: Kind = (EXTENSIONS_GROUP, AGENT_SANDBOX_VERSION, TEMPLATES)
WARM_POOL: Kind = (EXTENSIONS_GROUP, AGENT_SANDBOX_VERSION, WARM_POOLS)
COMPAT_CLAIM: Kind = (EXTENSIONS_GROUP, AGENT_SANDBOX_VERSION, COMPAT_CLAIMS)
MIRROR: Kind = (AGENTS_GROUP, AGENT_SANDBOX_VERSION, COMPAT_SANDBOXES)
POOL: Kind = (GROUP, VERSION, POOLS)
CLAIM: Kind = (GROUP, VERSION, CLAIMS)


class AgentSandboxApi:
    """Thin, synchronous calls over one ApiClient (run them off the event loop)."""

    def __init__(self, objects: Objects) -> None:
        self.custom: Any = objects.custom

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        group, version, plural = kind
        return answer_unless(
            lambda: self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name
            ),
            404,
        )

    def create(self, kind: Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The created object; None when the name is taken."""
        group, version, plural = kind
        return answer_unless(
            lambda: self.custom.create_namespaced_custom_object(
                group, version, namespace, plural, dict(body)
            ),
            409,
        )

    def replace_fields(
        self, kind: Kind, namespace: str, name: str, uid: str, fields: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Replace whole top-level paths (``/spec/template``: nothing of the old one
        is merged in), only while the object is still ``uid``; None when gone."""
        group, version, plural = kind
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        ops += [{"op": "add", "path": path, "value": value} for path, value in fields.items()]
        return answer_unless(
            lambda: self.custom.patch_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                ops,
                _content_type="application/json-patch+json",
            ),
            404,
            409,
            422,
        )

    def patch_status(
        self, kind: Kind, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return patch_custom_status(self.custom, kind, namespace, name, status)

    def delete(self, kind: Kind, namespace: str, name: str, uid: str) -> bool:
        """Delete it if it is still ``uid``; False when gone or another object."""
        return delete_exact(self.custom, kind, namespace, name, uid)


def claim_env_of(api: Any, namespace: str, sandbox: str, timeout: float) -> dict[str, str]:
    """The environment an agent-sandbox claim gives every command run in ``sandbox``
    through it: its ``spec.env`` when the sandbox is bound to that claim (a sandlot
    claim of the same name, whose status names the sandbox), else none."""
    custom: Any = client.CustomObjectsApi(api)
    try:
        body = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOXES, sandbox, _request_timeout=timeout
        )
        claim_name = ((body.get("metadata") or {}).get("labels") or {}).get(CLAIM_LABEL)
        if not claim_name:
            return {}
        claim = custom.get_namespaced_custom_object(
            *COMPAT_CLAIM[:2], namespace, COMPAT_CLAIM[2], claim_name, _request_timeout=timeout
        )
    except ApiException as e:
        if e.status == 404:  # no such claim, or agent-sandbox's API not installed
            return {}
        raise
    if ((claim.get("status") or {}).get("sandbox") or {}).get("name") != sandbox:
        return {}
    return claim_env(claim.get("spec") or {})
