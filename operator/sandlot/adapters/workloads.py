"""API calls of the scheduler, the pool controller and routing.

Each call answers in the controllers' terms (bound, lost a race, gone) so no
controller has to know an ``ApiException``. Binding carries the sandbox's
resourceVersion: of two schedulers (or two passes of one) that read the same
version, exactly one wins; the other gets a 409, re-reads, and finds it bound.
Service and EndpointSlice are written with server-side apply under one field
manager, so a write of an unchanged object changes nothing on the server, and
the slice's ``endpoints`` (an atomic list) is replaced whole. A Service is only
ever created (never written over one that appeared meanwhile) or replaced with
the resourceVersion its ownership was judged on, so the check and the write are
one step (``write_service``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kubeprivate import to_json
from sandlot.adapters.objects import Objects, answer_unless, delete_exact, patch_custom_status
from sandlot.api.common import CLAIMS, GROUP, KUBE_NODES, POOLS, SANDBOXES, VERSION, key_of

log = logging.getLogger(__name__)

FIELD_MANAGER = "sandlot-operator"
APPLY = "application/apply-patch+yaml"


@dataclass(frozen=True)
class BindResult:
    outcome: Literal["bound", "taken", "conflict", "gone"]
    body: dict[str, Any] | None = None  # the sandbox as last seen


def bind_sandbox(
    objects: Objects, namespace: str, name: str, node: str, resource_version: str
) -> BindResult:
    """Set ``spec.nodeName`` if the sandbox is still at ``resource_version``.

    ``taken``: someone bound it meanwhile (body is the fresh read);
    ``conflict``: it changed but is still unbound (retry with the body's version).
    """
    patch = {"metadata": {"resourceVersion": resource_version}, "spec": {"nodeName": node}}
    path = ("apis", GROUP, VERSION, "namespaces", namespace, SANDBOXES, name)
    try:  # on the lean path of the status writes: the scheduler's one write per sandbox
        body = objects.patcher.patch(*path, body=patch)
        return BindResult("bound", body)
    except ApiException as e:
        if e.status == 404:
            return BindResult("gone")
        if e.status != 409:
            raise
    try:
        current = objects.get_sandbox(namespace, name)
    except ApiException as e:
        if e.status == 404:
            return BindResult("gone")
        raise
    if (current.get("spec") or {}).get("nodeName"):
        return BindResult("taken", current)
    return BindResult("conflict", current)


def write_sandbox_status(
    objects: Objects,
    namespace: str,
    name: str,
    status: Mapping[str, Any],
    resource_version: str,
) -> dict[str, Any] | None:
    """Status with a precondition; None when it changed meanwhile or is gone."""
    return answer_unless(
        lambda: objects.patch_sandbox_status(namespace, name, status, resource_version), 404, 409
    )


def create_sandbox(objects: Objects, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(
        objects.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOXES, dict(body)
        )
    )


def delete_sandbox(
    objects: Objects, namespace: str, name: str, uid: str, resource_version: str | None = None
) -> bool:
    """Delete this very sandbox (uid precondition) and, given ``resource_version``,
    only as it was then; False when it is already gone or changed since (409)."""
    kind = (GROUP, VERSION, SANDBOXES)
    return delete_exact(objects.custom, kind, namespace, name, uid, resource_version)


def read_pool(objects: Objects, namespace: str, name: str) -> dict[str, Any] | None:
    """The SandboxPool, or None when there is none of that name."""
    return answer_unless(
        lambda: objects.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POOLS, name),
        404,
    )


def take_sandbox(
    objects: Objects,
    namespace: str,
    name: str,
    resource_version: str,
    metadata: Mapping[str, Any],
) -> dict[str, Any] | None:
    """Merge ``metadata`` (labels, ownerReferences) into the sandbox if it is still at
    ``resource_version``; None when it changed meanwhile or is gone."""
    patch = {"metadata": {**metadata, "resourceVersion": resource_version}}
    return answer_unless(
        lambda: objects.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOXES, name, patch
        ),
        404,
        409,
    )


def delete_claim(objects: Objects, namespace: str, name: str, uid: str) -> bool:
    """Delete this very claim (uid precondition); False when it is already gone."""
    return delete_exact(objects.custom, (GROUP, VERSION, CLAIMS), namespace, name, uid)


def listed_keys(objects: Objects, plural: str) -> set[str]:
    """Every object of sandlot's kind ``plural`` (or every Kubernetes Node, for
    ``KUBE_NODES``) now, as "namespace/name" (or the name of a cluster-scoped one),
    in pages."""
    keys: set[str] = set()
    token: str | None = None
    core: Any = client.CoreV1Api(objects.api)
    while True:
        extra = {"_continue": token} if token else {}
        if plural == KUBE_NODES:
            out = core.list_node(limit=500, _request_timeout=60, _preload_content=False, **extra)
            out = json.loads(out.data)
        else:
            out = objects.custom.list_cluster_custom_object(
                GROUP, VERSION, plural, limit=500, _request_timeout=60, **extra
            )
        for item in out.get("items") or ():
            keys.add(key_of(item))
        token = (out.get("metadata") or {}).get("continue") or None
        if token is None:
            return keys


class WorkloadApi:
    """The calls the scheduler and the pool controller make, as one object.

    The controllers take this instead of the module functions so a unit test can
    hand them an in-memory one with the same answers.
    """

    def __init__(self, objects: Objects) -> None:
        self.objects = objects

    def get_sandbox(self, namespace: str, name: str) -> dict[str, Any]:
        return self.objects.get_sandbox(namespace, name)

    def bind(self, namespace: str, name: str, node: str, resource_version: str) -> BindResult:
        return bind_sandbox(self.objects, namespace, name, node, resource_version)

    def write_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        return write_sandbox_status(self.objects, namespace, name, status, resource_version)

    def create_sandbox(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return create_sandbox(self.objects, namespace, body)

    def delete_sandbox(
        self, namespace: str, name: str, uid: str, resource_version: str | None = None
    ) -> bool:
        return delete_sandbox(self.objects, namespace, name, uid, resource_version)

    def patch_pool_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return patch_custom_status(
            self.objects.custom, (GROUP, VERSION, POOLS), namespace, name, status
        )

    def take_sandbox(
        self, namespace: str, name: str, resource_version: str, metadata: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return take_sandbox(self.objects, namespace, name, resource_version, metadata)

    def patch_claim_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return patch_custom_status(
            self.objects.custom, (GROUP, VERSION, CLAIMS), namespace, name, status
        )

    def delete_claim(self, namespace: str, name: str, uid: str) -> bool:
        return delete_claim(self.objects, namespace, name, uid)

    def listed_keys(self, plural: str) -> set[str]:
        return listed_keys(self.objects, plural)

    def get_runtime_class(self, name: str) -> dict[str, Any] | None:
        return self.objects.get_runtime_class(name)

    def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get_snapshot(namespace, name)


# -- Service and EndpointSlices ------------------------------------------------------


def get_service(objects: Objects, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        svc = client.CoreV1Api(objects.api).read_namespaced_service(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return dict(to_json(objects.api, svc))


class ServiceChanged(Exception):
    """The Service appeared, changed or was replaced since it was read: read it again
    and judge anew whose it is."""


def write_service(
    objects: Objects,
    namespace: str,
    body: Mapping[str, Any],
    seen: Mapping[str, Any] | None,
) -> None:
    """Write the Service as judged on ``seen``, the read that found it absent (None:
    create only) or found it the pool's (replace, with ``seen``'s resourceVersion as
    precondition). Raises ``ServiceChanged`` when the server holds anything else.

    A replace, not an apply: the object is whole, so a port the pool dropped goes,
    whichever manager wrote it; fields the server allocated (clusterIP) and others'
    labels and annotations are kept from ``seen``."""
    core: Any = client.CoreV1Api(objects.api)
    name = body["metadata"]["name"]
    try:
        if seen is None:
            core.create_namespaced_service(namespace, dict(body), field_manager=FIELD_MANAGER)
        else:
            core.replace_namespaced_service(
                name, namespace, service_replacement(seen, body), field_manager=FIELD_MANAGER
            )
    except ApiException as e:
        # 409: created meanwhile (create) or a newer version (replace); 404: deleted since.
        if e.status in (404, 409):
            raise ServiceChanged(f"Service {namespace}/{name} changed since it was read") from e
        raise


def service_replacement(seen: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """``seen`` with ``body``'s labels, owner and spec laid over it (``seen``'s
    resourceVersion kept: the precondition)."""
    want = body["metadata"]
    meta = {k: v for k, v in seen["metadata"].items() if k != "managedFields"}
    meta["labels"] = {**(meta.get("labels") or {}), **(want.get("labels") or {})}
    meta["ownerReferences"] = want["ownerReferences"]
    spec = {k: v for k, v in (seen.get("spec") or {}).items() if k != "ports"}
    spec.update(body["spec"])
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def delete_service(objects: Objects, namespace: str, name: str) -> None:
    try:
        client.CoreV1Api(objects.api).delete_namespaced_service(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise


def apply_endpoint_slice(objects: Objects, namespace: str, body: Mapping[str, Any]) -> None:
    client.DiscoveryV1Api(objects.api).patch_namespaced_endpoint_slice(
        body["metadata"]["name"],
        namespace,
        dict(body),
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type=APPLY,
    )


def list_endpoint_slices(objects: Objects, namespace: str, label_selector: str) -> list[str]:
    """Names of the EndpointSlices matching ``label_selector``."""
    out: Any = client.DiscoveryV1Api(objects.api).list_namespaced_endpoint_slice(
        namespace, label_selector=label_selector
    )
    return [str(item.metadata.name) for item in out.items]


def delete_endpoint_slice(objects: Objects, namespace: str, name: str) -> None:
    try:
        client.DiscoveryV1Api(objects.api).delete_namespaced_endpoint_slice(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
