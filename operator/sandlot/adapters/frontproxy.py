"""What the API server tells aggregated API servers about its front proxy.

``kube-system/extension-apiserver-authentication`` (written by kube-apiserver from
its ``--requestheader-*`` flags) holds the CA of the client certificate the API
server presents when it proxies a request, the names that certificate may carry,
and the headers naming the user. An aggregated API server reads it with the
built-in Role ``extension-apiserver-authentication-reader``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.policy.streamaccess import (
    RequestHeaderConfig,
    requestheader_config,
)

NAMESPACE = "kube-system"
CONFIGMAP = "extension-apiserver-authentication"
CA_KEY = "requestheader-client-ca-file"


class NoFrontProxy(Exception):
    """The API server publishes no front-proxy CA: it cannot proxy to an aggregated API."""


@dataclass(frozen=True)
class FrontProxy:
    ca_pem: str
    config: RequestHeaderConfig


def read_front_proxy(api: client.ApiClient, *, timeout: float) -> FrontProxy:
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(
            CONFIGMAP, NAMESPACE, _request_timeout=timeout
        )
    except ApiException as e:
        if e.status == 404:
            raise NoFrontProxy(
                f"{NAMESPACE}/{CONFIGMAP} does not exist: is this a Kubernetes API server?"
            ) from None
        raise
    data = dict(cm.data or {})
    ca = data.get(CA_KEY, "").strip()
    if not ca:
        raise NoFrontProxy(
            f"{NAMESPACE}/{CONFIGMAP} has no {CA_KEY}: the API server runs without "
            "--requestheader-client-ca-file, so it cannot reach aggregated APIs"
        )
    return FrontProxy(ca, requestheader_config(data))


__all__ = ["CONFIGMAP", "FrontProxy", "NoFrontProxy", "read_front_proxy"]
