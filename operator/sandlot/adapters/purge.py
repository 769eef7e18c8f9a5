"""The API calls of ``sandlot purge``: list, cordon, strip finalizers, delete.

Every call is one object at a time with verbs a least-privilege role can grant
(list, patch, delete; never deletecollection), so the chart's uninstall hooks
need nothing more. A 404 is success: something else deleted the object first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects
from sandlot.api.common import (
    CACHEPRUNES,
    CLAIMS,
    GROUP,
    NODES,
    POOLS,
    SANDBOXES,
    SNAPSHOTS,
    VERSION,
    join_key,
    key_of,
)
from sandlot.api.keys import AGENT_LEASE_LABEL
from sandlot.policy.purge import AgentLease, SandboxRef

WORKLOADS = (CLAIMS, POOLS, SANDBOXES, SNAPSHOTS, CACHEPRUNES)
"""Deleted in this order: a pool deleted first no longer replaces its members
(nor a claim's, which leave their pool); snapshots after the sandboxes forked
from them, so the operator lets them go at once."""


@dataclass(frozen=True)
class Item:
    plural: str
    name: str
    namespace: str | None
    finalizers: tuple[str, ...]
    deleting: bool

    @property
    def key(self) -> str:
        return join_key(self.namespace, self.name) if self.namespace else self.name


def _ignore_missing(exc: ApiException) -> None:
    if exc.status != 404:
        raise exc


def list_items(objects: Objects, plural: str) -> list[Item]:
    """Every object of ``plural`` in every namespace."""
    out = objects.custom.list_cluster_custom_object(GROUP, VERSION, plural)
    items = []
    for obj in out.get("items", []):
        meta = obj["metadata"]
        items.append(
            Item(
                plural=plural,
                name=meta["name"],
                namespace=meta.get("namespace"),
                finalizers=tuple(meta.get("finalizers") or ()),
                deleting=bool(meta.get("deletionTimestamp")),
            )
        )
    return items


def sandbox_refs(objects: Objects) -> list[SandboxRef]:
    out = objects.custom.list_cluster_custom_object(GROUP, VERSION, SANDBOXES)
    return [
        SandboxRef(
            key=key_of(sb),
            node=(sb.get("spec") or {}).get("nodeName"),
            phase=(sb.get("status") or {}).get("phase"),
        )
        for sb in out.get("items", [])
    ]


def _patch(objects: Objects, item: Item, body: dict[str, Any]) -> None:
    try:
        if item.namespace:
            objects.custom.patch_namespaced_custom_object(
                GROUP, VERSION, item.namespace, item.plural, item.name, body
            )
        else:
            objects.custom.patch_cluster_custom_object(GROUP, VERSION, item.plural, item.name, body)
    except ApiException as e:
        _ignore_missing(e)


def delete(objects: Objects, item: Item) -> None:
    try:
        if item.namespace:
            objects.custom.delete_namespaced_custom_object(
                GROUP, VERSION, item.namespace, item.plural, item.name
            )
        else:
            objects.custom.delete_cluster_custom_object(GROUP, VERSION, item.plural, item.name)
    except ApiException as e:
        _ignore_missing(e)


def remove_finalizers(objects: Objects, item: Item) -> None:
    """Drop every finalizer (merge patch): nobody is left to run them."""
    _patch(objects, item, {"metadata": {"finalizers": None}})


def cordon_all(objects: Objects) -> list[str]:
    """Set ``spec.unschedulable: true`` (as ``sandlot drain`` does) on every SandboxNode
    that lacks it; the names patched. Called on every pass, so a node that registers
    while purge runs is cordoned too."""
    out = objects.custom.list_cluster_custom_object(GROUP, VERSION, NODES)
    patched = []
    for node in out.get("items", []):
        meta = node["metadata"]
        if meta.get("deletionTimestamp") or (node.get("spec") or {}).get("unschedulable"):
            continue
        item = Item(NODES, meta["name"], None, (), False)
        _patch(objects, item, {"spec": {"unschedulable": True}})
        patched.append(item.name)
    return patched


def agent_leases(objects: Objects, namespace: str) -> dict[str, AgentLease]:
    """The agents' node Leases in sandlot's namespace, by node name."""
    out = objects.coordination.list_namespaced_lease(
        namespace, label_selector=f"{AGENT_LEASE_LABEL}=true"
    )
    return {
        lease.metadata.name: AgentLease(
            renew_time=lease.spec.renew_time,
            duration_seconds=int(lease.spec.lease_duration_seconds or 0),
        )
        for lease in out.items
    }


def delete_lease(objects: Objects, namespace: str, name: str) -> None:
    try:
        objects.coordination.delete_namespaced_lease(name, namespace)
    except ApiException as e:
        _ignore_missing(e)
