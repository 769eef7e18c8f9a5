"""The reads behind ``sandlot status``: every SandboxNode, Sandbox and SandboxPool,
listed in pages so a fleet of ten thousand sandboxes never comes back as one
response. Read-only; returns the objects as plain dicts for the CLI to summarize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client

from sandlot.api.common import GROUP, NODES, POOLS, SANDBOXES, VERSION

PAGE = 500


@dataclass(frozen=True)
class FleetSnapshot:
    nodes: list[dict[str, Any]]
    sandboxes: list[dict[str, Any]]
    pools: list[dict[str, Any]]


def _list_all(api: client.ApiClient, plural: str, namespace: str | None) -> list[dict[str, Any]]:
    custom: Any = client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": PAGE, "_request_timeout": 30}
        if token:
            kwargs["_continue"] = token
        if namespace:
            out = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **kwargs)
        else:
            out = custom.list_cluster_custom_object(GROUP, VERSION, plural, **kwargs)
        items.extend(out.get("items", []))
        token = (out.get("metadata") or {}).get("continue")
        if not token:
            return items


def read_fleet(api: client.ApiClient, namespace: str | None = None) -> FleetSnapshot:
    """Nodes (cluster-scoped), and the sandboxes and pools of ``namespace`` (or all)."""
    return FleetSnapshot(
        nodes=_list_all(api, NODES, None),
        sandboxes=_list_all(api, SANDBOXES, namespace),
        pools=_list_all(api, POOLS, namespace),
    )
