"""Traffic to a pool: a Service without a selector and EndpointSlices listing the
pool's Running members, both owned by the pool.

Kubernetes' own endpoint controllers only follow Pods, so sandlot writes the
slices itself, the way any custom endpoint source does: labels
``kubernetes.io/service-name`` (the Service they belong to) and
``endpointslice.kubernetes.io/managed-by: sandlot.dev`` (so the EndpointSlice
controller leaves them alone), one endpoint per Running member with its IP,
``conditions.ready`` (its ``Ready``: ``policy.readiness``), its node and a
``targetRef`` to the Sandbox.

The pool controller calls ``sync`` at the start of every reconcile of a pool,
before it replaces anyone: a member that is no longer Running leaves the slice
in the same pass that sees it go. What was last applied is remembered, so an
unchanged pool costs no request; the memory is dropped on a leadership change
(and the first pass after it lists the pool's slices, so stale ones go).

Slices hold at most ``MAX_ENDPOINTS`` endpoints (Kubernetes' default per slice),
filled in member-name order: simple and deterministic, at the cost that one
member leaving rewrites the slice it was in and the ones after it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandlot.adapters.objects import Objects
from sandlot.adapters.workloads import (
    ServiceChanged,
    apply_endpoint_slice,
    delete_endpoint_slice,
    delete_service,
    get_service,
    list_endpoint_slices,
    write_service,
)
from sandlot.api.common import API_VERSION, controller_reference, join_key
from sandlot.api.keys import ENDPOINTSLICE_MANAGED_BY_LABEL as MANAGED_BY_LABEL
from sandlot.api.keys import ENDPOINTSLICE_MANAGER as MANAGED_BY
from sandlot.api.keys import (
    POOL_LABEL,
    SERVICE_MANAGED_BY_LABEL,
    SERVICE_MANAGER,
    SERVICE_NAME_LABEL,
)
from sandlot.api.sandbox import SandboxPhase
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.sandboxes import SandboxRecord

log = logging.getLogger(__name__)

MAX_ENDPOINTS = 100


@dataclass(frozen=True)
class PoolRef:
    """What routing needs of a pool."""

    namespace: str
    name: str
    uid: str
    service_name: str | None
    ports: tuple[Mapping[str, Any], ...]  # the template's spec.ports, as on the wire

    @property
    def key(self) -> str:
        return join_key(self.namespace, self.name)

    def owner_reference(self) -> dict[str, Any]:
        return controller_reference(
            API_VERSION, "SandboxPool", self.name, self.uid, block_owner_deletion=True
        )


def port_names(ports: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each port's name; a Service with several ports needs every one named."""
    if len(ports) == 1:
        return [str(ports[0].get("name") or "")]
    return [str(p.get("name") or f"port-{p['containerPort']}") for p in ports]


def desired_service(pool: PoolRef) -> dict[str, Any]:
    assert pool.service_name
    spec: dict[str, Any]
    if pool.ports:
        spec = {
            "ports": [
                {
                    "name": name,
                    "port": int(p["containerPort"]),
                    "targetPort": int(p["containerPort"]),
                    "protocol": p.get("protocol") or "TCP",
                }
                for name, p in zip(port_names(pool.ports), pool.ports, strict=True)
            ]
        }
    else:
        spec = {"clusterIP": "None"}  # no ports: a headless Service (DNS only)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pool.service_name,
            "namespace": pool.namespace,
            "labels": {POOL_LABEL: pool.name, SERVICE_MANAGED_BY_LABEL: SERVICE_MANAGER},
            "ownerReferences": [pool.owner_reference()],
        },
        "spec": spec,
    }


def slice_name(service: str, index: int) -> str:
    return f"{service}-sandlot" if index == 0 else f"{service}-sandlot-{index}"


def routable(ip: str) -> bool:
    """Whether the API server accepts ``ip`` as an IPv4 endpoint address: it refuses
    unspecified, loopback, link-local and link-local multicast addresses (a host
    whose name resolves to 127.0.1.1 reports such an address)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return addr.version == 4 and not (
        addr.is_unspecified
        or addr.is_loopback
        or addr.is_link_local
        or addr in ipaddress.ip_network("224.0.0.0/24")
    )


def _endpoint(member: SandboxRecord) -> dict[str, Any] | None:
    if member.phase != SandboxPhase.RUNNING or member.paused or not member.ip:
        return None  # a paused member's frozen process would hold every request
    if not routable(member.ip):
        log.debug("sandbox %s: address %s cannot be an endpoint", member.key, member.ip)
        return None
    # A member whose readiness probe has not passed is listed not ready (as a Pod's
    # endpoint is): proxies send it nothing, and its address is known in advance.
    endpoint: dict[str, Any] = {
        "addresses": [member.ip],
        "conditions": {"ready": member.ready, "serving": member.ready, "terminating": False},
        "targetRef": {
            "apiVersion": API_VERSION,
            "kind": "Sandbox",
            "namespace": member.namespace,
            "name": member.name,
            "uid": member.uid,
        },
    }
    if member.node:
        endpoint["nodeName"] = member.node
    return endpoint


def desired_slices(pool: PoolRef, members: Sequence[SandboxRecord]) -> list[dict[str, Any]]:
    """The pool's EndpointSlices: every Running member with an IPv4 address.

    Always at least one slice (possibly empty), so consumers see the Service has
    a source of endpoints and that it has none right now.
    """
    assert pool.service_name
    endpoints = [
        e for e in (_endpoint(m) for m in sorted(members, key=lambda m: m.name)) if e is not None
    ]
    ports = [
        {"name": name, "port": int(p["containerPort"]), "protocol": p.get("protocol") or "TCP"}
        for name, p in zip(port_names(pool.ports), pool.ports, strict=True)
    ]
    chunks = [endpoints[i : i + MAX_ENDPOINTS] for i in range(0, len(endpoints), MAX_ENDPOINTS)]
    return [
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice_name(pool.service_name, i),
                "namespace": pool.namespace,
                "labels": {
                    SERVICE_NAME_LABEL: pool.service_name,
                    MANAGED_BY_LABEL: MANAGED_BY,
                    POOL_LABEL: pool.name,
                },
                "ownerReferences": [pool.owner_reference()],
            },
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": chunk,
        }
        for i, chunk in enumerate(chunks or [[]])
    ]


def _fingerprint(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass
class _Applied:
    service_name: str
    service: str | None = None  # fingerprint of the applied Service; None: not ours
    slices: dict[str, str] = field(default_factory=dict)  # name -> fingerprint


class ServiceTaken(Exception):
    """A Service of the pool's serviceName exists and belongs to something else."""


SERVICE_WRITE_ATTEMPTS = 3


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj`` carries an ownerReference to the object with ``uid``."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("uid") == uid for o in owners)


class Router:
    """Writes a pool's Service and EndpointSlices; synchronous (run it off the loop)."""

    def __init__(self, objects: Objects, metrics: WorkloadMetrics) -> None:
        self.objects = objects
        self.metrics = metrics
        self._applied: dict[str, _Applied] = {}

    def reset(self) -> None:
        self._applied.clear()

    def forget(self, pool_key: str) -> None:
        self._applied.pop(pool_key, None)

    def sync(self, pool: PoolRef, members: Sequence[SandboxRecord]) -> bool:
        """Bring the pool's Service and slices in line; True when anything was written."""
        applied = self._applied.get(pool.key)
        if applied is not None and applied.service_name != pool.service_name:
            self._remove(pool, applied)
            applied = None
        if not pool.service_name:
            return False
        wrote = False
        if applied is None:
            applied = self._first_sync(pool)
        service = desired_service(pool)
        service_print = _fingerprint(service)
        if applied.service != service_print:
            self._write_service(pool, service)
            applied.service = service_print
            wrote = True
        wanted = desired_slices(pool, members)
        for body in wanted:
            name = body["metadata"]["name"]
            printed = _fingerprint(body)
            if applied.slices.get(name) != printed:
                apply_endpoint_slice(self.objects, pool.namespace, body)
                self.metrics.endpointslice_writes.labels(op="apply").inc()
                applied.slices[name] = printed
                wrote = True
        names = {b["metadata"]["name"] for b in wanted}
        for name in [n for n in applied.slices if n not in names]:
            delete_endpoint_slice(self.objects, pool.namespace, name)
            self.metrics.endpointslice_writes.labels(op="delete").inc()
            del applied.slices[name]
            wrote = True
        return wrote

    def _write_service(self, pool: PoolRef, service: Mapping[str, Any]) -> None:
        """Judge whose the Service is and write it as one step: the write is
        conditional on exactly what was judged (``write_service``). A Service that
        changed in between is judged again, a few times at most."""
        assert pool.service_name
        for _ in range(SERVICE_WRITE_ATTEMPTS):
            existing = get_service(self.objects, pool.namespace, pool.service_name)
            if existing is not None and not owned_by(existing, pool.uid):
                raise ServiceTaken(
                    f"Service {pool.namespace}/{pool.service_name} exists and is not owned "
                    f"by SandboxPool {pool.name}; not touching it"
                )
            try:
                write_service(self.objects, pool.namespace, service, existing)
                return
            except ServiceChanged as e:
                log.info("pool %s: %s; reading it again", pool.key, e)
        raise ServiceChanged(
            f"Service {pool.namespace}/{pool.service_name} kept changing over "
            f"{SERVICE_WRITE_ATTEMPTS} attempts to write it"
        )

    def _first_sync(self, pool: PoolRef) -> _Applied:
        assert pool.service_name
        applied = _Applied(service_name=pool.service_name)
        selector = f"{SERVICE_NAME_LABEL}={pool.service_name},{MANAGED_BY_LABEL}={MANAGED_BY}"
        for name in list_endpoint_slices(self.objects, pool.namespace, selector):
            applied.slices[name] = ""  # unknown content: rewritten or deleted below
        self._applied[pool.key] = applied
        return applied

    def _remove(self, pool: PoolRef, applied: _Applied) -> None:
        """serviceName changed or went away: delete what was written under the old one."""
        for name in list(applied.slices):
            delete_endpoint_slice(self.objects, pool.namespace, name)
            self.metrics.endpointslice_writes.labels(op="delete").inc()
        if applied.service is not None:
            delete_service(self.objects, pool.namespace, applied.service_name)
        self._applied.pop(pool.key, None)
