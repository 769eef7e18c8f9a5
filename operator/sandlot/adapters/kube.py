"""Kubernetes API access: client construction, CRD installation, and a client-side
request counter.

Controllers and the agent get an ``ApiClient`` from here and use the typed
helpers in ``sandlot.adapters.objects``; nothing else imports ``kubernetes``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kubeprivate import install_request, request_of
from sandlot.api.errors import UsageError
from sandlot.api.leaderfence import refused_as_non_holder

__all__ = [
    "ApiException",
    "NotLeader",
    "RequestCounter",
    "ServerFenced",
    "WriteFence",
    "apply_crds",
    "load_api_client",
]


log = logging.getLogger(__name__)


class ConfigError(UsageError):
    """The kubeconfig (or in-cluster config) cannot be used; the message says why."""


class NotLeader(RuntimeError):
    """A write was refused before it was sent: this replica is not (or no longer) the leader."""


class ServerFenced(NotLeader):
    """The API server's leader fence (``sandlot.api.leaderfence``) refused a write:
    it sees another holder of the leader Lease. Retryable: right after a takeover
    the server's copy of the Lease may still name the previous holder."""


MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Waits before resending a write the server's leader fence refused while this replica
# still leads by its own clock: the API server's informer trails a takeover by
# milliseconds, so the new leader's first writes can be refused. Bounded (about 1.5 s
# in all) and only while the client fence allows, so a deposed leader never retries.
FENCE_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)


class WriteFence:
    """Lets a write through only while ``allowed()`` holds; knows how many are in flight.

    Every mutating request of a fenced ApiClient asks first, so a replica that lost
    its leadership (or cannot prove it still has it) stops writing at the next
    request, whatever loop or thread sends it: node health, scheduler, pools,
    routing and Events alike. ``close`` refuses everything from then on and waits
    for the writes already sent, so the leader Lease is released only once nothing
    of this replica can still land.
    """

    def __init__(self, allowed: Callable[[], bool]) -> None:
        self.allowed = allowed
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closed = False

    @contextmanager
    def permit(self, what: str) -> Iterator[None]:
        with self._cond:
            if self._closed or not self.allowed():
                raise NotLeader(f"not the leader: refused {what}")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def open(self) -> bool:
        """Whether a write asked for now would be let through."""
        with self._cond:
            return not self._closed and self.allowed()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def close(self, timeout: float) -> bool:
        """Refuse every write from now on; True once none is in flight (within ``timeout``)."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout)


class RequestCounter:
    """Counts requests an ApiClient sends, by (verb, path shape). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[tuple[str, str]] = Counter()
        self.fenced: Counter[tuple[str, str]] = Counter()

    def record(self, method: str, url: str) -> None:
        path = url.split("?", 1)[0]
        with self._lock:
            self.calls[(method.upper(), path)] += 1

    def record_fenced(self, method: str, url: str) -> None:
        """A write the API server's leader fence refused."""
        path = url.split("?", 1)[0]
        with self._lock:
            self.fenced[(method.upper(), path)] += 1

    def record_failure(self, method: str, url: str, code: str) -> None:
        """A request the API server failed: a 5xx answer (its code), or none at all
        (``"none"``: a timeout, a refused or broken connection)."""

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.calls)


def resource_of(url: str) -> str:
    """The resource a request URL addresses: ``.../namespaces/ns/leases/x`` -> ``leases``."""
    parts = [p for p in url.split("?", 1)[0].split("/") if p]
    for marker in ("apis", "api"):
        if marker in parts:
            parts = parts[parts.index(marker) + 1 :]
            break
    # /api/v1/... has no group; /apis/group/version/... has one.
    parts = parts[1:] if parts and parts[0].startswith("v") else parts[2:]
    if len(parts) >= 2 and parts[0] == "namespaces":
        parts = parts[2:] or ["namespaces"]
    return parts[0] if parts else "unknown"


def load_api_client(
    kubeconfig: str | None = None,
    *,
    counter: RequestCounter | None = None,
    pool_size: int = 32,
    request_timeout: tuple[float, float] | float = (5.0, 30.0),
    fence: WriteFence | None = None,
    user_agent: str | None = None,
) -> client.ApiClient:
    """An ApiClient from ``kubeconfig`` (or $KUBECONFIG / ~/.kube/config), else in-cluster.

    A malformed or missing kubeconfig raises ``ConfigError`` naming the file and
    the problem instead of a traceback deep in the client. With ``fence``, every
    mutating request asks it first and raises ``NotLeader`` when refused.
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
    if user_agent:
        api.user_agent = user_agent
    original = request_of(api)

    def bounded(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        # No request waits without a bound: calls that do not choose a timeout get
        # DEFAULT_REQUEST_TIMEOUT (a hung API server must not stall a loop forever).
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = request_timeout

        def send() -> Any:
            if counter is None:
                return original(method, url, *args, **kwargs)
            counter.record(method, url)
            try:
                response = original(method, url, *args, **kwargs)
            except ApiException as e:
                if (e.status or 0) >= 500:
                    counter.record_failure(method, url, str(e.status))
                raise
            except (OSError, urllib3.exceptions.HTTPError):
                counter.record_failure(method, url, "none")
                raise
            status = getattr(response, "status", None)
            if isinstance(status, int) and status >= 500:
                counter.record_failure(method, url, str(status))
            return response

        if fence is not None and method.upper() in MUTATING_METHODS:
            what = f"{method.upper()} {url.split('?', 1)[0]}"
            with fence.permit(what):
                return _through_server_fence(fence, send, what, counter, method, url)
        return send()

    install_request(api, bounded)
    return api


def _through_server_fence(
    fence: WriteFence,
    send: Callable[[], Any],
    what: str,
    counter: RequestCounter | None,
    method: str,
    url: str,
    *,
    delays: tuple[float, ...] = FENCE_RETRY_DELAYS,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """``send()``; a refusal by the server's leader fence is resent after a short wait
    while this replica still leads by its own clock, else raised as ``ServerFenced``.
    The REST client returns an error response as it came (the generated API raises
    ``ApiException`` later, when it reads it), so the refusal is read here."""
    for delay in (*delays, None):
        response = send()
        if getattr(response, "status", None) != 403:
            return response
        body = response.read()
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        if not refused_as_non_holder(text):
            return response
        if counter is not None:
            counter.record_fenced(method, url)
        if delay is None or not fence.open():
            log.warning("leader fence: the API server refused %s: %s", what, text)
            raise ServerFenced(f"the API server's leader fence refused {what}: {text}")
        log.info("leader fence: %s refused while leading; resending in %.2fs", what, delay)
        sleep(delay)
    raise AssertionError("unreachable: the last delay is None")


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


def connection_params(api: client.ApiClient) -> dict[str, Any]:
    """Server, CA and credentials of ``api``: what kopf's ConnectionInfo takes, so
    kopf talks to the same cluster as the same user as our own client."""
    cfg = api.configuration
    params: dict[str, Any] = {
        "server": cfg.host,
        "ca_path": cfg.ssl_ca_cert,
        "insecure": not cfg.verify_ssl,
        "certificate_path": cfg.cert_file,
        "private_key_path": cfg.key_file,
    }
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if auth:
        scheme, _, token = auth.partition(" ")
        params["scheme"], params["token"] = (scheme, token) if token else ("Bearer", scheme)
    return params
