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
from sandlot.policy.streams import SUBRESOURCE_GROUP, SUBRESOURCE_VERSION

APISERVICE = f"{SUBRESOURCE_VERSION}.{SUBRESOURCE_GROUP}"
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
            "stream_ca": str(certs.ca.cert),
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
    api: client.ApiClient, namespace: str, ip: str, port: int, ca_file: Path
) -> None:
    """Record the gateway at ``ip:port`` as the chart would, and wait until the API
    server counts the APIService Available (it has reached the gateway)."""
    core: Any = client.CoreV1Api(api)
    service: dict[str, Any] = {
        "metadata": {"name": GATEWAY_NAME, "namespace": namespace},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
    }
    try:
        core.create_namespaced_service(namespace, service)
    except ApiException as e:
        if e.status != 409:
            raise
    endpoints = {
        "metadata": {"name": GATEWAY_NAME, "namespace": namespace},
        "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port}]}],
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
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    _apply(
        lambda ns, body: discovery.create_namespaced_endpoint_slice(ns, body),
        lambda ns, body: discovery.replace_namespaced_endpoint_slice(GATEWAY_NAME, ns, body),
        namespace,
        slice_,
    )
    registration: Any = client.ApiregistrationV1Api(api)
    body: dict[str, Any] = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {
            "group": SUBRESOURCE_GROUP,
            "version": SUBRESOURCE_VERSION,
            "service": {"namespace": namespace, "name": GATEWAY_NAME, "port": 443},
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
        current = registration.read_api_service(APISERVICE)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        registration.replace_api_service(APISERVICE, body)
    wait_available(api)


def wait_available(api: client.ApiClient, timeout: float = AVAILABLE_TIMEOUT) -> None:
    registration = client.ApiregistrationV1Api(api)
    deadline = time.monotonic() + timeout
    last = "not read yet"
    while time.monotonic() < deadline:
        service = registration.read_api_service(APISERVICE)
        for condition in (service.status and service.status.conditions) or []:
            if condition.type == "Available":
                if condition.status == "True":
                    return
                last = f"{condition.reason}: {condition.message}"
        time.sleep(0.2)
    raise TimeoutError(f"APIService {APISERVICE} not Available within {timeout:g}s ({last})")


def remove_gateway(api: client.ApiClient, namespace: str) -> None:
    """Take the APIService, Service and endpoints away (missing ones are fine)."""
    deletes: tuple[Callable[[], Any], ...] = (
        lambda: client.ApiregistrationV1Api(api).delete_api_service(APISERVICE),
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
    parts.gateway.start()
    try:
        publish_gateway(api, namespace, ip, parts.gateway.port, certs.ca.cert)
        yield parts
    finally:
        remove_gateway(api, namespace)
        parts.gateway.shutdown()


__all__ = [
    "APISERVICE",
    "STANDIN_SELECTOR",
    "gateway_settings",
    "publish_gateway",
    "remove_gateway",
    "running_gateway",
]
