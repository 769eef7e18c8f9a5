"""Brokered registry credentials: the Secret per node that carries the pull secrets
of that node's sandboxes, and the only one its agent may read (docs/isolation.md).

The operator, which may read Secrets, writes ``sandlot-pull-<node>`` in its own
namespace with one key per pull secret (``<namespace>.<name>``: that Secret's
``.dockerconfigjson``), one per Secret or ConfigMap the sandboxes' environments
reference (``_<kind>.<namespace>.<name>``: the keys they use, ``policy.envrefs``), and a Role and
RoleBinding that let only the node's agent
identity (the ServiceAccount ``sandlot-agent-<node>``) ``get`` that one Secret.
"""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.policy.envrefs import Referenced

log = logging.getLogger(__name__)

BrokeredData = Callable[[], Mapping[str, str] | None]
"""This node's brokered Secret's data (base64 values), or None when absent."""

DOCKERCONFIG_TYPE = "kubernetes.io/dockerconfigjson"
DOCKERCONFIG_KEY = ".dockerconfigjson"


def brokered_secret_name(node: str) -> str:
    return f"sandlot-pull-{node}"


def brokered_key(namespace: str, name: str) -> str:
    """The key of a sandbox's pull secret in its node's brokered Secret."""
    return f"{namespace}.{name}"


def reference_key(namespace: str, kind: str, name: str) -> str:
    """The key of an object a sandbox's environment references (``kind`` ``secret`` or
    ``configmap``) in its node's brokered Secret. A namespace never starts with ``_``
    nor holds a ``.``, so no pull secret's key is ever one of these."""
    return f"_{kind}.{namespace}.{name}"


def node_identity(node: str) -> str:
    """The ServiceAccount (in the operator's namespace) that may read the node's Secret."""
    return f"sandlot-agent-{node}"


class NodeIdentity:
    """An API client acting as the node's identity, from a token the API server issues.

    The agent's own ServiceAccount is shared by every node and may read no Secret;
    it may ask for a token of ``sandlot-agent-<node>``, and an admission policy lets
    it do so only for the node named in its own pod-bound token. Tokens are
    short-lived and renewed before they expire.
    """

    def __init__(self, api: Any, namespace: str, node: str, lifetime: int = 600) -> None:
        self._api, self.namespace, self.node, self.lifetime = api, namespace, node, lifetime
        self._client: Any = None
        self._expires = 0.0

    def client(self) -> Any:
        import time

        if self._client is None or time.monotonic() > self._expires:
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=self.lifetime)
            )
            answer = client.CoreV1Api(self._api).create_namespaced_service_account_token(
                node_identity(self.node), self.namespace, request
            )
            token = answer.status.token if answer.status is not None else None
            if not token:
                raise RuntimeError(f"no token issued for {node_identity(self.node)}")
            config = copy.copy(self._api.configuration)
            config.api_key = {"authorization": f"Bearer {token}"}
            config.api_key_prefix = {}
            config.username = config.password = None
            config.cert_file = config.key_file = None
            config.refresh_api_key_hook = None
            if self._client is not None:
                self._client.close()
            self._client = client.ApiClient(config)
            self._expires = time.monotonic() + self.lifetime / 2
        return self._client


def read_brokered(api: Any, namespace: str, node: str) -> dict[str, str] | None:
    """The node's brokered Secret's data; None when it is absent or not readable."""
    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(brokered_secret_name(node), namespace)
    except ApiException as exc:
        if exc.status in (403, 404):
            if exc.status == 403:
                log.warning("brokered pull secret of node %s is not readable: %s", node, exc.reason)
            return None
        raise
    return {k: str(v) for k, v in (secret.data or {}).items()}


def read_pull_secret(api: Any, namespace: str, name: str) -> str | None:
    """A tenant's dockerconfigjson Secret's document (base64), or None when it is
    missing, of another type, or in a namespace that did not let the operator read
    its pull secrets (the operator's read)."""
    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 403:
            log.warning(
                "pull secret %s/%s: namespace %s does not let sandlot read its pull secrets "
                "(operator.pullSecretNamespaces, docs/isolation.md)",
                namespace,
                name,
                namespace,
            )
            return None
        if exc.status == 404:
            return None
        raise
    if secret.type != DOCKERCONFIG_TYPE:
        log.warning("pull secret %s/%s is of type %s: ignored", namespace, name, secret.type)
        return None
    document = (secret.data or {}).get(DOCKERCONFIG_KEY)
    return str(document) if document is not None else None


def read_referenced(
    api: Any, namespace: str, kind: str, name: str, keys: set[str] | None
) -> Referenced:
    """The ``keys`` (None: all) of a Secret or ConfigMap an environment references,
    as the operator reads it. A namespace that does not let the operator read it
    (403) reads as missing, as an absent object does."""
    core = client.CoreV1Api(api)
    try:
        if kind == "secret":
            secret = core.read_namespaced_secret(name, namespace)
            raw = secret.data or {}
            data = {
                k: base64.b64decode(v).decode("utf-8", errors="replace") for k, v in raw.items()
            }
        else:
            data = dict(core.read_namespaced_config_map(name, namespace).data or {})
    except ApiException as exc:
        if exc.status == 403:
            log.warning(
                "%s %s/%s: namespace %s does not let sandlot read it "
                "(operator.pullSecretNamespaces, docs/isolation.md)",
                kind,
                namespace,
                name,
                namespace,
            )
            return Referenced(found=False)
        if exc.status == 404:
            return Referenced(found=False)
        raise
    if keys is not None:
        data = {k: v for k, v in data.items() if k in keys}
    return Referenced(found=True, data=data)


def write_brokered(api: Any, namespace: str, node: str, data: Mapping[str, str]) -> None:
    """Make the node's brokered Secret hold exactly ``data``, and its access rule."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    name = brokered_secret_name(node)
    labels = {"app.kubernetes.io/managed-by": "sandlot", "sandlot.dev/node": node}
    account = client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=node_identity(node), labels=labels),
        automount_service_account_token=False,
    )
    _apply(
        lambda: core.create_namespaced_service_account(namespace, account),
        lambda: None,  # exists: nothing of it changes
    )
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels=labels), type="Opaque", data=dict(data)
    )
    _apply(
        lambda: core.create_namespaced_secret(namespace, body),
        lambda: core.replace_namespaced_secret(name, namespace, body),
    )
    role = client.V1Role(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        rules=[
            client.V1PolicyRule(
                api_groups=[""], resources=["secrets"], resource_names=[name], verbs=["get"]
            )
        ],
    )
    _apply(
        lambda: rbac.create_namespaced_role(namespace, role),
        lambda: rbac.replace_namespaced_role(name, namespace, role),
    )
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
        subjects=[
            client.RbacV1Subject(
                kind="ServiceAccount", name=node_identity(node), namespace=namespace
            )
        ],
    )
    _apply(
        lambda: rbac.create_namespaced_role_binding(namespace, binding),
        lambda: rbac.replace_namespaced_role_binding(name, namespace, binding),
    )


def _apply(create: Any, replace: Any) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise
        replace()


def node_brokered_data(api: Any, namespace: str, node: str, what: str = "data") -> BrokeredData:
    """A reader of this node's brokered Secret as the node's own identity; with no
    identity yet nothing is brokered (None), and a line says there is no ``what``."""
    identity = NodeIdentity(api, namespace, node)

    def read() -> Mapping[str, str] | None:
        try:
            return read_brokered(identity.client(), namespace, node)
        except Exception as exc:  # no identity yet: nothing brokered
            log.info("no brokered %s for this node: %s", what, exc)
            return None

    return read


def brokered_data(api: Any, namespace: str, node: str) -> dict[str, str] | None:
    """The node's brokered Secret's data as the operator reads it; None when absent."""
    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(brokered_secret_name(node), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: str(v) for k, v in (secret.data or {}).items()}


__all__ = [
    "BrokeredData",
    "NodeIdentity",
    "brokered_data",
    "brokered_key",
    "brokered_secret_name",
    "node_brokered_data",
    "node_identity",
    "read_brokered",
    "read_pull_secret",
    "read_referenced",
    "reference_key",
    "write_brokered",
]
