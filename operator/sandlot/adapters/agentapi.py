"""The agent's extra API calls: registering its SandboxNode and answering
CachePrune requests (which it learns of by watch, ``sandboxwatch``). Kept beside
``objects`` (which they use) so the agent, like the controllers, never imports
``kubernetes`` itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects
from sandlot.api.common import CACHEPRUNES, GROUP, NODES, VERSION


def ensure_node(
    objects: Objects, name: str, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The SandboxNode ``name``, created (spec defaults) if it does not exist yet."""
    existing = objects.get_node(name)
    if existing is not None:
        return existing
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxNode",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
    }
    try:
        return dict(objects.custom.create_cluster_custom_object(GROUP, VERSION, NODES, body))
    except ApiException as e:
        if e.status != 409:  # created concurrently: read it
            raise
    created = objects.get_node(name)
    if created is None:
        raise RuntimeError(f"SandboxNode {name} vanished right after it was created")
    return created


def patch_cacheprune_result(
    objects: Objects, name: str, node: str, result: Mapping[str, Any]
) -> dict[str, Any]:
    """Merge-patch ``status.results[node]`` only: each node's entry is its own key."""
    body = {"status": {"results": {node: dict(result)}}}
    return dict(
        objects.custom.patch_cluster_custom_object_status(GROUP, VERSION, CACHEPRUNES, name, body)
    )


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404
