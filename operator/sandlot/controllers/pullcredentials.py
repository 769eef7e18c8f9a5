"""The operator brokers registry credentials to the node that needs them.

Tenants name ``imagePullSecrets`` in their sandboxes; the agent of the sandbox's
node needs those credentials, and must not be able to read any Secret it likes
(an agent is a node, and a node reaches only its own business). So the operator,
which may read Secrets, copies the pull secrets of a node's non-terminal
sandboxes into that node's brokered Secret, readable by that node's identity
alone (``adapters.pullsecrets``, docs/isolation.md). A sandbox event with pull
secrets and a node, and each node's resync, re-broker the node; nothing is
written when the brokered data is already right, and only the leader writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf

from sandlot.adapters.objects import Objects
from sandlot.adapters.pullsecrets import (
    brokered_data,
    brokered_key,
    read_pull_secret,
    write_brokered,
)
from sandlot.api.common import GROUP, VERSION
from sandlot.api.sandbox import TERMINAL_PHASES

log = logging.getLogger(__name__)


def wanted_secrets(sandboxes: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(namespace, name) of the pull secrets of the non-terminal sandboxes, once each."""
    seen: dict[tuple[str, str], None] = {}
    for sb in sandboxes:
        if (sb.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        namespace = sb["metadata"]["namespace"]
        for ref in (sb.get("spec") or {}).get("imagePullSecrets") or []:
            if ref.get("name"):
                seen[(namespace, str(ref["name"]))] = None
    return list(seen)


def broker_node(objects: Objects, namespace: str, node: str) -> bool:
    """Make the node's brokered Secret hold its sandboxes' pull secrets; True if written."""
    api = objects.api
    data: dict[str, str] = {}
    for ns, name in wanted_secrets(objects.list_node_sandboxes(node)):
        document = read_pull_secret(api, ns, name)
        if document is not None:
            data[brokered_key(ns, name)] = document
    current = brokered_data(api, namespace, node)
    if current == data or (current is None and not data):
        return False
    write_brokered(api, namespace, node, data)
    log.info("brokered %d pull secret(s) to node %s", len(data), node)
    return True


def register(
    registry: kopf.OperatorRegistry, objects: Objects, leading: Callable[[], bool], namespace: str
) -> None:
    def wants_credentials(body: kopf.Body, **_: Any) -> bool:
        spec = body.get("spec") or {}
        return bool(spec.get("imagePullSecrets") and spec.get("nodeName"))

    # What each sandbox last brought to its node: its status writes (progress,
    # phases) change nothing of it and cost no request here.
    brought: dict[str, tuple[str, tuple[str, ...], bool]] = {}

    # A plain function: kopf runs it in a thread, so its requests block no handler.
    @kopf.on.event(GROUP, VERSION, "sandboxes", when=wants_credentials, registry=registry)
    def sandbox_with_secrets(body: kopf.Body, **kwargs: Any) -> None:
        uid = str(body["metadata"]["uid"])
        if kwargs.get("type") == "DELETED":
            brought.pop(uid, None)
        node = str(body["spec"]["nodeName"])
        secrets = tuple(str(r.get("name")) for r in body["spec"]["imagePullSecrets"])
        signature = (node, secrets, (body.get("status") or {}).get("phase") in TERMINAL_PHASES)
        if not leading() or brought.get(uid) == signature:
            return
        broker_node(objects, namespace, node)
        brought[uid] = signature


__all__ = ["broker_node", "register", "wanted_secrets"]
