"""The API calls of ``sandlot drain`` and ``sandlot uncordon``.

Draining is a flag on the SandboxNode (``spec.unschedulable``): the scheduler
stops placing sandboxes there and the node's agent stops each of its sandboxes
gracefully. The command only sets the flag and watches the node empty out.
"""

from __future__ import annotations

from kubernetes.client.rest import ApiException

from sandlot.adapters.objects import NODES, Objects
from sandlot.api.common import GROUP, VERSION
from sandlot.api.sandbox import TERMINAL_PHASES


class NodeNotFound(LookupError):
    pass


def set_unschedulable(objects: Objects, node: str, unschedulable: bool) -> None:
    try:
        objects.custom.patch_cluster_custom_object(
            GROUP, VERSION, NODES, node, {"spec": {"unschedulable": unschedulable}}
        )
    except ApiException as e:
        if e.status == 404:
            raise NodeNotFound(f"SandboxNode {node} does not exist") from e
        raise


def live_sandboxes(objects: Objects, node: str) -> list[str]:
    """``namespace/name`` of the node's non-terminal sandboxes (selected by the server)."""
    return sorted(
        f"{sb['metadata']['namespace']}/{sb['metadata']['name']}"
        for sb in objects.list_node_sandboxes(node)
        if (sb.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )
