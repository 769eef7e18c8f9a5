"""The operator's state keys: one Secret per owner (a Sandbox's or SandboxSnapshot's
uid) in the operator's namespace, ``sandlot-state-key-<uid>``, made the first time
a node needs it and deleted when its owner is (``policy.statekeys``). Only the
operator reads them; nodes get the keys they may hold through their brokered
Secret (``adapters.pullsecrets``).
"""

from __future__ import annotations

import base64
import os

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.pulling.sealed import KEY_BYTES
from sandlot.policy.statekeys import key_secret_name

KEY_FIELD = "key"


def ensure_key(api: client.ApiClient, namespace: str, owner: str) -> str:
    """``owner``'s key (base64, as a Secret's data holds it), made now if it has none."""
    core = client.CoreV1Api(api)
    name = key_secret_name(owner)
    try:
        found = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
    else:
        return str((found.data or {})[KEY_FIELD])
    value = base64.b64encode(os.urandom(KEY_BYTES)).decode()
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={"app.kubernetes.io/managed-by": "sandlot", "sandlot.dev/state-key": owner},
        ),
        type="Opaque",
        data={KEY_FIELD: value},
    )
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        # Made meanwhile by another pass: that one is the key.
        return str((core.read_namespaced_secret(name, namespace).data or {})[KEY_FIELD])
    return value


def delete_key(api: client.ApiClient, namespace: str, owner: str) -> bool:
    """Delete ``owner``'s key; False when it had none."""
    try:
        client.CoreV1Api(api).delete_namespaced_secret(key_secret_name(owner), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


__all__ = ["KEY_FIELD", "delete_key", "ensure_key"]
