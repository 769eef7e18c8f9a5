"""The stream gateway on the local control plane, reached as users reach it.

In a cluster the chart runs the gateway as a Deployment behind a Service, and an
APIService tells the API server to proxy ``subresources.sandlot.dev`` to it. Here
the gateway is a thread or a process on this host, so the rig records what the
chart would: a Service without a selector, its endpoints at the stream address
(``streamnet``: the API server refuses loopback endpoints), and the APIService
with the stream CA. The API server runs with ``--enable-aggregator-routing`` (no
kube-proxy), so it dials that endpoint, presenting its front-proxy certificate.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.agentpods import STANDIN_COMPONENT
from sandlot.devtools.certs import GATEWAY_NAME, StreamCerts
from sandlot.gateway.runner import GatewayParts, build
from sandlot.gateway.settings import GatewaySettings
from sandlot.policy.router import ROUTER_GROUP, ROUTER_VERSION
from sandlot.policy.streams import SUBRESOURCE_GROUP, SUBRESOURCE_VERSION

APISERVICE = f"{SUBRESOURCE_VERSION}.{SUBRESOURCE_GROUP}"
ROUTER_APISERVICE = f"{ROUTER_VERSION}.{ROUTER_GROUP}"
ROUTER_SERVICE_PORT = 444
STANDIN_SELECTOR = f"app.kubernetes.io/name=sandlot,app.kubernetes.io/component={STANDIN_COMPONENT}"
AVAILABLE_TIMEOUT = 60.0


def gateway_settings(
    certs: StreamCerts, namespace: str, ip: str, port: int, **more: object
) -> GatewaySettings:
    """The rig's gateway: on the stream address, finding the agents' stand-in Pods."""
    return GatewaySettings.model_validate(
        {
            "namespace": namespace,
            "bind": ip,
            "port": port,
            "tls_cert": str(certs.gateway.cert),
            "tls_key": str(certs.gateway.key),
            "stream_ca": str(certs.agent_ca.cert),
            "agent_selector": STANDIN_SELECTOR,
            "metrics_port": 0,
            **more,
        }
    )


def _apply(create: object, replace: object, *args: object) -> None:
    try:
        create(*args)  # type: ignore[operator]
    except ApiException as e:
        if e.status != 409:
            raise
        replace(*args)  # type: ignore[operator]


def publish_gateway(
    api: client.ApiClient,
    namespace: str,
    ip: str,
    port: int,
    ca_file: Path,
    router_port: int | None = None,
) -> None:
    """Record the gateway at ``ip:port`` (and its router at ``router_port``) as the
    chart would, and wait until the API server counts each APIService Available (it
    has reached the gateway)."""
    core: Any = client.CoreV1Api(api)
    ports = [("https", 443, port)]
    if router_port is not None:
        ports.append(("router", ROUTER_SERVICE_PORT, router_port))
    service: dict[str, Any] = {
        "metadata": {"name": GATEWAY_NAME, "namespace": namespace},
        "spec": {"ports": [{"name": n, "port": p, "targetPort": t} for n, p, t in ports]},
    }
    try:
        core.create_namespaced_service(namespace, service)
    except ApiException as e:
        if e.status != 409:
            raise
    endpoints = {
        "metadata": {"name": GATEWAY_NAME, "namespace": namespace},
        "subsets": [
            {"addresses": [{"ip": ip}], "ports": [{"name": n, "port": t} for n, _, t in ports]}
        ],
    }
    _apply(
        lambda ns, body: core.create_namespaced_endpoints(ns, body),
        lambda ns, body: core.replace_namespaced_endpoints(GATEWAY_NAME, ns, body),
        namespace,
        endpoints,
    )
    discovery: Any = client.DiscoveryV1Api(api)
    slice_ = {
        "metadata": {
            "name": GATEWAY_NAME,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": GATEWAY_NAME},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": n, "port": t, "protocol": "TCP"} for n, _, t in ports],
    }
    _apply(
        lambda ns, body: discovery.create_namespaced_endpoint_slice(ns, body),
        lambda ns, body: discovery.replace_namespaced_endpoint_slice(GATEWAY_NAME, ns, body),
        namespace,
        slice_,
    )
    services = [(APISERVICE, SUBRESOURCE_GROUP, SUBRESOURCE_VERSION, 443)]
    if router_port is not None:
        services.append((ROUTER_APISERVICE, ROUTER_GROUP, ROUTER_VERSION, ROUTER_SERVICE_PORT))
    for name, group, version, service_port in services:
        _register(api, namespace, ca_file, name, group, version, service_port)
        wait_available(api, name=name)


def _register(
    api: client.ApiClient,
    namespace: str,
    ca_file: Path,
    name: str,
    group: str,
    version: str,
    service_port: int,
) -> None:
    registration: Any = client.ApiregistrationV1Api(api)
    body: dict[str, Any] = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "version": version,
            "service": {"namespace": namespace, "name": GATEWAY_NAME, "port": service_port},
            "caBundle": base64.b64encode(ca_file.read_bytes()).decode(),
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
        },
    }
    try:
        registration.create_api_service(body)
    except ApiException as e:
        if e.status != 409:
            raise
        current = registration.read_api_service(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        registration.replace_api_service(name, body)


def wait_available(
    api: client.ApiClient, timeout: float = AVAILABLE_TIMEOUT, *, name: str = APISERVICE
) -> None:
    registration = client.ApiregistrationV1Api(api)
    deadline = time.monotonic() + timeout
    last = "not read yet"
    while time.monotonic() < deadline:
        service = registration.read_api_service(name)
        for condition in (service.status and service.status.conditions) or []:
            if condition.type == "Available":
                if condition.status == "True":
                    return
                last = f"{condition.reason}: {condition.message}"
        time.sleep(0.2)
    raise TimeoutError(f"APIService {name} not Available within {timeout:g}s ({last})")


def remove_gateway(api: client.ApiClient, namespace: str) -> None:
    """Take the APIService, Service and endpoints away (missing ones are fine)."""
    deletes: tuple[Callable[[], Any], ...] = (
        lambda: client.ApiregistrationV1Api(api).delete_api_service(APISERVICE),
        lambda: client.ApiregistrationV1Api(api).delete_api_service(ROUTER_APISERVICE),
        lambda: client.CoreV1Api(api).delete_namespaced_service(GATEWAY_NAME, namespace),
        lambda: client.CoreV1Api(api).delete_namespaced_endpoints(GATEWAY_NAME, namespace),
        lambda: client.DiscoveryV1Api(api).delete_namespaced_endpoint_slice(
            GATEWAY_NAME, namespace
        ),
    )
    for delete in deletes:
        try:
            delete()
        except ApiException as e:
            if e.status != 404:
                raise


@contextmanager
def running_gateway(
    api: client.ApiClient,
    certs: StreamCerts,
    namespace: str,
    ip: str,
    **more: object,
) -> Iterator[GatewayParts]:
    """The gateway in a thread of this process, published to the API server."""
    settings = gateway_settings(certs, namespace, ip, 0, **more)
    parts = build(settings, api, registry=CollectorRegistry())
    parts.start()
    try:
        router = parts.router.port if parts.router is not None else None
        publish_gateway(api, namespace, ip, parts.gateway.port, certs.ca.cert, router)
        yield parts
    finally:
        remove_gateway(api, namespace)
        parts.shutdown()


__all__ = [
    "APISERVICE",
    "ROUTER_APISERVICE",
    "STANDIN_SELECTOR",
    "gateway_settings",
    "publish_gateway",
    "remove_gateway",
    "running_gateway",
]
