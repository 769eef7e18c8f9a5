"""The API calls of ``sandlot drain``, ``sandlot uncordon`` and ``sandlot nodes reap``.

Draining is a flag on the SandboxNode (``spec.unschedulable``): the scheduler
stops placing sandboxes there and the node's agent stops each of its sandboxes
gracefully. The command only sets the flag and watches the node empty out.
"""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects
from sandlot.api.common import GROUP, NODES, SANDBOXES, VERSION, key_of, split_key
from sandlot.api.node import NodePhase
from sandlot.api.sandbox import TERMINAL_PHASES
from sandlot.api.timestamps import rfc3339


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


def read_sandbox(objects: Objects, key: str) -> dict[str, Any] | None:
    """The sandbox ``namespace/name`` as it is now; None once it is gone."""
    namespace, name = split_key(key)
    try:
        return objects.get_sandbox(namespace, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def set_operating_mode(objects: Objects, key: str, mode: str) -> None:
    """``spec.operatingMode`` of sandbox ``namespace/name`` (nothing when it is gone)."""
    namespace, name = split_key(key)
    try:
        objects.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOXES, name, {"spec": {"operatingMode": mode}}
        )
    except ApiException as e:
        if e.status != 404:
            raise


def live_sandboxes(objects: Objects, node: str) -> list[str]:
    """``namespace/name`` of the node's non-terminal sandboxes (selected by the server)."""
    return sorted(
        key_of(sb)
        for sb in objects.list_node_sandboxes(node)
        if (sb.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )


class NodeNotReapable(ValueError):
    """The node is not NotReady in a recorded episode: a reap decision has nothing to name."""


def requester(objects: Objects) -> str:
    """Who the API server says we are (a SelfSubjectReview), else the local user name."""
    try:
        review = client.AuthenticationV1Api(objects.api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        user = review.status.user_info if review.status is not None else None
        if user is not None and user.username:
            return str(user.username)
    except (ApiException, ValueError):
        pass
    return getpass.getuser()


def request_reap(objects: Objects, node: str, requested_by: str, reason: str | None) -> str:
    """Record an operator's decision that ``node`` is lost (``spec.reap``), naming the
    NotReady episode its status records; returns that episode's unhealthySince.

    The patch carries the resourceVersion the status was read at, so a node that
    renewed (or was handled) in between is read again rather than reaped on a stale view.
    """
    for _ in range(5):
        body = objects.get_node(node)
        if body is None:
            raise NodeNotFound(f"SandboxNode {node} does not exist")
        status = body.get("status") or {}
        health = status.get("health") or {}
        since = health.get("unhealthySince")
        if status.get("phase") != NodePhase.NOT_READY or not since:
            raise NodeNotReapable(
                f"SandboxNode {node} is {status.get('phase') or 'without a phase'}, not "
                "NotReady: only a node whose lease has expired can be declared lost"
            )
        if health.get("handledAt"):
            raise NodeNotReapable(
                f"SandboxNode {node}'s sandboxes were already marked Dead at "
                f"{health['handledAt']}: nothing is left to reap"
            )
        request = {
            "unhealthySince": since,
            "requestedAt": rfc3339(datetime.now(UTC), "seconds"),
            "requestedBy": requested_by,
            "reason": reason,
        }
        patch = {
            "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
            "spec": {"reap": request},
        }
        try:
            objects.custom.patch_cluster_custom_object(GROUP, VERSION, NODES, node, patch)
        except ApiException as e:
            if e.status == 409:
                continue  # the node changed since it was read: judge it again
            raise
        return str(since)
    raise NodeNotReapable(f"SandboxNode {node} kept changing; try again")


def reap_outcome(objects: Objects, node: str, since: str) -> tuple[str, int] | None:
    """(handledAt, sandboxes marked) once the operator acted on the decision; None before."""
    body = objects.get_node(node)
    if body is None:
        raise NodeNotFound(f"SandboxNode {node} was deleted")
    health = (body.get("status") or {}).get("health") or {}
    if health.get("unhealthySince") != since:
        raise NodeNotReapable(f"SandboxNode {node} renewed its lease: the decision lapsed")
    if not health.get("handledAt"):
        return None
    return str(health["handledAt"]), int(health.get("handledCount") or 0)
