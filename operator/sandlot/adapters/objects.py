"""Typed access to sandlot's objects, Leases and Events over the Kubernetes API.

Status is only ever written through the status subresource. Where a write must
not clobber a concurrent one (marking a sandbox Dead, the agent's phase changes),
it carries the object's resourceVersion and handles 409 by re-reading
(``statuswrite``): an object already in a terminal phase is done, anything else is
retried with the new version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kubeprivate import to_json
from sandlot.adapters.mergepatch import MergePatcher
from sandlot.api.common import GROUP, NODES, SANDBOXES, SNAPSHOTS, VERSION
from sandlot.api.timestamps import parse_time

log = logging.getLogger(__name__)


def answer_unless(call: Callable[[], Any], *statuses: int) -> dict[str, Any] | None:
    """The API's answer to ``call`` as a dict, or None when it answered one of
    ``statuses`` (404: gone; 409: changed meanwhile), as controller-runtime's
    ``client.IgnoreNotFound`` does; any other error is raised."""
    try:
        return dict(call())
    except ApiException as e:
        if e.status in statuses:
            return None
        raise


def done_unless(call: Callable[[], object], *statuses: int) -> bool:
    """Whether ``call`` was done: False when the API answered one of ``statuses``
    (a delete of an object gone, or another object of that name now)."""
    try:
        call()
    except ApiException as e:
        if e.status in statuses:
            return False
        raise
    return True


def delete_exact(
    custom: Any,
    kind: tuple[str, str, str],
    namespace: str,
    name: str,
    uid: str,
    resource_version: str | None = None,
) -> bool:
    """Delete this very object of ``kind`` (group, version, plural): only while it is
    ``uid`` and, given ``resource_version``, as it was then; False when it is already
    gone or is not that object any more (404, 409)."""
    group, version, plural = kind
    preconditions = client.V1Preconditions(uid=uid, resource_version=resource_version)
    body = client.V1DeleteOptions(preconditions=preconditions)
    return done_unless(
        lambda: custom.delete_namespaced_custom_object(
            group, version, namespace, plural, name, body=body
        ),
        404,
        409,
    )


def patch_custom_status(
    custom: Any,
    kind: tuple[str, str, str],
    namespace: str,
    name: str,
    status: Mapping[str, Any],
) -> dict[str, Any] | None:
    """Merge ``status`` into the status of the namespaced object of ``kind`` (group,
    version, plural); None when it is gone (404)."""
    group, version, plural = kind
    return answer_unless(
        lambda: custom.patch_namespaced_custom_object_status(
            group, version, namespace, plural, name, {"status": dict(status)}
        ),
        404,
    )


class Objects:
    """Thin, synchronous helpers over one ApiClient (run them off the event loop)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom: Any = client.CustomObjectsApi(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        # Built here, not on the first Event: importing CoreV1Api costs ~20 MiB and
        # ~0.5 s of CPU, which would otherwise land inside the first node-health pass.
        self.core: Any = client.CoreV1Api(api)
        self.patcher = MergePatcher(api)  # the status writes' lean path

    # -- sandboxes --------------------------------------------------------------

    def list_node_sandboxes(self, node: str) -> list[dict[str, Any]]:
        """Every sandbox bound to ``node``, selected by the server (spec.nodeName)."""
        out = self.custom.list_cluster_custom_object(
            GROUP, VERSION, SANDBOXES, field_selector=f"spec.nodeName={node}"
        )
        return list(out.get("items", []))

    def node_sandboxes_page(
        self, node: str, limit: int, token: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of at most ``limit`` of ``node``'s sandboxes, selected by the server
        (spec.nodeName), after the page ``token`` names; with the next page's token,
        None after the last page."""
        extra = {"_continue": token} if token else {}
        out = self.custom.list_cluster_custom_object(
            GROUP, VERSION, SANDBOXES, field_selector=f"spec.nodeName={node}", limit=limit, **extra
        )
        return list(out.get("items", [])), (out.get("metadata") or {}).get("continue") or None

    def list_sandboxes(
        self, namespace: str, label_selector: str, *, limit: int = 500
    ) -> list[dict[str, Any]]:
        """At most ``limit`` sandboxes of ``namespace`` the server selects by labels."""
        out = self.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            SANDBOXES,
            label_selector=label_selector,
            limit=limit,
            _request_timeout=30,
        )
        return list(out.get("items", []))

    def list_all(self, plural: str, *, page: int = 500) -> list[dict[str, Any]]:
        """Every object of sandlot kind ``plural`` in every namespace, read in pages of
        ``page`` (each call bounded)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            out = self.custom.list_cluster_custom_object(
                GROUP, VERSION, plural, limit=page, _request_timeout=30, **extra
            )
            items.extend(out.get("items", []))
            token = (out.get("metadata") or {}).get("continue") or None
            if token is None:
                return items

    def get_sandbox(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, SANDBOXES, name, _request_timeout=30
            )
        )

    def find_sandbox(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Sandbox, None when there is none."""
        try:
            return self.get_sandbox(namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_sandbox_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        path = ("apis", GROUP, VERSION, "namespaces", namespace, SANDBOXES, name, "status")
        return self.patcher.patch(*path, body=body)

    # -- snapshots --------------------------------------------------------------

    def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The SandboxSnapshot, None when there is none."""
        try:
            return dict(
                self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SNAPSHOTS, name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_node_snapshots(self, node: str) -> list[dict[str, Any]]:
        """Every SandboxSnapshot bound to ``node``, selected by the server (spec.nodeName)."""
        out = self.custom.list_cluster_custom_object(
            GROUP, VERSION, SNAPSHOTS, field_selector=f"spec.nodeName={node}"
        )
        return list(out.get("items", []))

    def patch_snapshot(
        self, namespace: str, name: str, body: Mapping[str, Any], *, status: bool = False
    ) -> dict[str, Any]:
        """Merge-patch ``body`` onto the SandboxSnapshot (its status subresource when
        ``status``)."""
        path = ("apis", GROUP, VERSION, "namespaces", namespace, SNAPSHOTS, name)
        return self.patcher.patch(*path, *(("status",) if status else ()), body=body)

    def list_namespaced(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        """Every object of sandlot kind ``plural`` in ``namespace``."""
        out = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, _request_timeout=30
        )
        return list(out.get("items", []))

    def get_runtime_class(self, name: str) -> dict[str, Any] | None:
        """The RuntimeClass ``name`` (node.k8s.io/v1) as JSON, None when it does not exist."""
        try:
            return dict(to_json(self.api, client.NodeV1Api(self.api).read_runtime_class(name)))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    # -- nodes ------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_cluster_custom_object(GROUP, VERSION, NODES, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_node_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        return dict(
            self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, NODES, name, {"status": dict(status)}
            )
        )

    def patch_node_labels(
        self, name: str, labels: Mapping[str, str | None], resource_version: str
    ) -> bool:
        """Set (or, with None, remove) labels of a SandboxNode as of the version read;
        False when it changed since (409: its next event decides again) or is gone."""
        body = {"metadata": {"resourceVersion": resource_version, "labels": dict(labels)}}
        try:
            self.custom.patch_cluster_custom_object(GROUP, VERSION, NODES, name, body)
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    def patch_node_status_as_of(
        self, name: str, status: Mapping[str, Any], resource_version: str
    ) -> str | None:
        """Merge ``status`` into a SandboxNode's as of the version read; its new
        resourceVersion, or None when it changed since (409) or is gone."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        try:
            out = self.custom.patch_cluster_custom_object_status(GROUP, VERSION, NODES, name, body)
        except ApiException as e:
            if e.status in (404, 409):
                return None
            raise
        return str(out["metadata"]["resourceVersion"])

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self.custom.list_cluster_custom_object(GROUP, VERSION, NODES).get("items", []))


# -- leases ----------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRecord:
    name: str
    holder: str | None
    renew_time: datetime | None
    duration_seconds: int
    resource_version: str
    transitions: int = 0
    acquire_time: datetime | None = None


def _lease_record(obj: Any) -> LeaseRecord:
    spec = obj.spec
    return LeaseRecord(
        name=obj.metadata.name,
        holder=spec.holder_identity,
        renew_time=spec.renew_time,
        duration_seconds=int(spec.lease_duration_seconds or 0),
        resource_version=obj.metadata.resource_version,
        transitions=int(spec.lease_transitions or 0),
        acquire_time=spec.acquire_time,
    )


def lease_record_of(raw: Mapping[str, Any]) -> LeaseRecord:
    """A Lease as the API server sends it (JSON), without the generated models: a
    watch of 5,000 agents' Leases carries hundreds of these a second."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    return LeaseRecord(
        name=meta["name"],
        holder=spec.get("holderIdentity"),
        renew_time=parse_time(spec.get("renewTime")),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquire_time=parse_time(spec.get("acquireTime")),
    )


class Leases:
    """coordination.k8s.io/v1 Leases in one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api: Any = client.CoordinationV1Api(api)
        self.namespace = namespace

    def get(self, name: str) -> LeaseRecord | None:
        try:
            return _lease_record(self.api.read_namespaced_lease(name, self.namespace))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create(
        self,
        name: str,
        *,
        holder: str,
        duration_seconds: int,
        now: datetime,
        labels: Mapping[str, str] | None = None,
    ) -> LeaseRecord:
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {})),
            spec=client.V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=duration_seconds,
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        return _lease_record(self.api.create_namespaced_lease(self.namespace, body))

    def update(
        self,
        record: LeaseRecord,
        *,
        holder: str | None,
        duration_seconds: int,
        renew_time: datetime | None,
        acquire_time: datetime | None = None,
        transitions: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> LeaseRecord:
        """Replace the Lease's spec, conditional on ``record.resource_version`` (409 if stale)."""
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=record.name,
                resource_version=record.resource_version,
                labels=dict(labels) if labels is not None else None,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=duration_seconds,
                renew_time=renew_time,
                acquire_time=acquire_time or record.acquire_time,
                lease_transitions=record.transitions if transitions is None else transitions,
            ),
        )
        return _lease_record(self.api.replace_namespaced_lease(record.name, self.namespace, body))


def post_event(
    objects: Objects,
    involved: Mapping[str, Any],
    *,
    type_: str,
    reason: str,
    message: str,
    component: str,
    now: datetime | None = None,
    host: str | None = None,
) -> None:
    """Record a core/v1 Event about ``involved`` (``kubectl describe`` shows it).

    Events of cluster-scoped objects go to ``default``, as the kubelet's node events do.
    ``host``: the node reporting it (an agent's Events must name their node).
    """
    meta = involved["metadata"]
    namespace = meta.get("namespace") or "default"
    stamp = now or datetime.now(UTC)
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=namespace),
        involved_object=client.V1ObjectReference(
            api_version=involved.get("apiVersion"),
            kind=involved.get("kind"),
            name=meta["name"],
            namespace=meta.get("namespace"),
            uid=meta.get("uid"),
            resource_version=meta.get("resourceVersion"),
        ),
        type=type_,
        reason=reason,
        message=message[:1024],
        source=client.V1EventSource(component=component, host=host),
        first_timestamp=stamp,
        last_timestamp=stamp,
        count=1,
        reporting_component=component,
        reporting_instance=component,
    )
    objects.core.create_namespaced_event(namespace, event)
