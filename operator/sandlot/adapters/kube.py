"""Kubernetes API access: client construction, CRD installation, and a client-side
request counter.

Controllers and the agent get an ``ApiClient`` from here and use the typed
helpers in ``sandlot.adapters.objects``; nothing else imports ``kubernetes``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

__all__ = ["ApiException", "RequestCounter", "apply_crds", "load_api_client"]


class ConfigError(ValueError):
    """The kubeconfig (or in-cluster config) cannot be used; the message says why."""


class RequestCounter:
    """Counts requests an ApiClient sends, by (verb, path shape). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[tuple[str, str]] = Counter()

    def record(self, method: str, url: str) -> None:
        path = url.split("?", 1)[0]
        with self._lock:
            self.calls[(method.upper(), path)] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.calls)


def load_api_client(
    kubeconfig: str | None = None,
    *,
    counter: RequestCounter | None = None,
    pool_size: int = 32,
) -> client.ApiClient:
    """An ApiClient from ``kubeconfig`` (or $KUBECONFIG / ~/.kube/config), else in-cluster.

    A malformed or missing kubeconfig raises ``ConfigError`` naming the file and
    the problem instead of a traceback deep in the client.
    """
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
    except (
        config.ConfigException,
        yaml.YAMLError,
        OSError,
        TypeError,
        KeyError,
        AttributeError,
    ) as e:
        where = kubeconfig or "$KUBECONFIG / ~/.kube/config / in-cluster"
        raise ConfigError(f"cannot load Kubernetes configuration from {where}: {e}") from e
    cfg.connection_pool_maxsize = pool_size
    api = client.ApiClient(cfg)
    if counter is not None:
        original = api.rest_client.request

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            counter.record(method, url)
            return original(method, url, *args, **kwargs)

        api.rest_client.request = counted  # type: ignore[method-assign]
    return api


def apply_crds(
    api: client.ApiClient, documents: Iterable[dict[str, Any]], *, timeout: float = 60.0
) -> list[str]:
    """Create or update CRDs (server-side apply) and wait until each is Established."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for doc in documents:
        name = doc["metadata"]["name"]
        names.append(name)
        ext.patch_custom_resource_definition(
            name,
            doc,
            field_manager="sandlot",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        for name in sorted(pending):
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in ((crd.status and crd.status.conditions) or [])}
            if conds.get("Established") == "True":
                pending.discard(name)
        if not pending:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRDs not Established within {timeout:.0f}s: {sorted(pending)}")
        time.sleep(0.1)
    return names
