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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandlot.adapters.objects import Objects
from sandlot.adapters.pullsecrets import (
    brokered_data,
    brokered_key,
    read_pull_secret,
    write_brokered,
)
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


class PullCredentialBroker:
    """A sandbox-feed listener (on the event loop): a sandbox with pull secrets and a
    node re-brokers that node, on a thread of its own, so no request blocks the loop.

    Every replica follows the feed; only the leader brokers. The feed lists every
    sandbox as soon as a replica starts, usually before it leads, so what it saw
    while standing by is kept (``wanted``) and brokered when it becomes the leader.
    """

    def __init__(self, objects: Objects, leading: Callable[[], bool], namespace: str) -> None:
        self.objects = objects
        self.leading = leading
        self.namespace = namespace
        # What each sandbox with pull secrets brings to its node (node, secrets,
        # terminal); its status writes (progress, phases) change nothing of it.
        self.wanted: dict[str, tuple[str, tuple[str, ...], bool]] = {}
        # What this leader brokered for each: the same signature costs no request.
        self.brought: dict[str, tuple[str, tuple[str, ...], bool]] = {}
        self._broker = ThreadPoolExecutor(1, thread_name_prefix="pull-credentials")

    def on_sandbox(self, event_type: str, body: Mapping[str, Any]) -> None:
        spec = body.get("spec") or {}
        if not (spec.get("imagePullSecrets") and spec.get("nodeName")):
            return
        uid = str(body["metadata"]["uid"])
        node = str(spec["nodeName"])
        secrets = tuple(str(r.get("name")) for r in spec["imagePullSecrets"])
        signature = (node, secrets, (body.get("status") or {}).get("phase") in TERMINAL_PHASES)
        if event_type == "DELETED":
            self.wanted.pop(uid, None)
            self.brought.pop(uid, None)
        else:
            self.wanted[uid] = signature
        if not self.leading() or self.brought.get(uid) == signature:
            return
        self.brought[uid] = signature  # one request per change, even before it is answered
        self._broker.submit(self._rebroker, [node], [uid])

    def on_leadership(self, leader: bool) -> None:
        """On the loop. A new leader brokers every node it saw a sandbox want
        credentials for; what it brokered as an earlier leader may be stale."""
        self.brought.clear()
        if not leader:
            return
        nodes = sorted({signature[0] for signature in self.wanted.values()})
        self.brought.update(self.wanted)
        if nodes:
            self._broker.submit(self._rebroker, nodes, list(self.wanted))

    def close(self) -> None:
        self._broker.shutdown(wait=False, cancel_futures=True)

    def _rebroker(self, nodes: list[str], uids: list[str]) -> None:
        failed = []
        for node in nodes:
            try:
                broker_node(self.objects, self.namespace, node)
            except Exception as e:
                log.warning("pull secrets not brokered to node %s: %s", node, e)
                failed.append(node)
        if failed:  # the next event of each of these sandboxes tries again
            for uid in uids:
                signature = self.brought.get(uid)
                if signature is not None and signature[0] in failed:
                    self.brought.pop(uid, None)


__all__ = ["PullCredentialBroker", "broker_node", "wanted_secrets"]
