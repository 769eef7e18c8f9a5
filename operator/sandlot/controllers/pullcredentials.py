"""The operator brokers registry credentials to the node that needs them.

Tenants name ``imagePullSecrets`` in their sandboxes, and Secrets and ConfigMaps
in their environments (``env[].valueFrom``, ``envFrom``); the agent of the sandbox's
node needs those credentials, and must not be able to read any Secret it likes
(an agent is a node, and a node reaches only its own business). So the operator,
which may read Secrets, copies the pull secrets of a node's non-terminal
sandboxes, and the keys their environments use, into that node's brokered
Secret, readable by that node's identity alone (``adapters.pullsecrets``,
docs/isolation.md). A sandbox event with either and a node, and each node's resync,
re-broker the node; nothing is
written when the brokered data is already right, and only the leader writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sandlot.adapters.objects import Objects
from sandlot.adapters.pullsecrets import (
    brokered_data,
    brokered_key,
    read_pull_secret,
    read_referenced,
    reference_key,
    write_brokered,
)
from sandlot.adapters.statekeys import ensure_key
from sandlot.api.envvars import EnvFromSource, EnvVar
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import TERMINAL_PHASES, SandboxPhase
from sandlot.api.snapshot import TERMINAL_SNAPSHOT_PHASES
from sandlot.policy.envrefs import encode, wanted_keys
from sandlot.policy.statekeys import brokered_key as brokered_state_key
from sandlot.policy.statekeys import node_keys

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


_ENV = TypeAdapter(list[EnvVar])
_ENV_FROM = TypeAdapter(list[EnvFromSource])
Wanted = dict[tuple[str, str, str], set[str] | None]
"""(namespace, kind, name) of a referenced object: the keys wanted, None for all."""


def env_references(spec: Mapping[str, Any]) -> Wanted:
    """What one sandbox's environment references; nothing for a spec that does not
    parse (the API server's schema refused it already)."""
    if not (spec.get("envFrom") or any("valueFrom" in (e or {}) for e in spec.get("env") or [])):
        return {}
    try:
        env, env_from = (
            _ENV.validate_python(spec.get("env") or []),
            _ENV_FROM.validate_python(spec.get("envFrom") or []),
        )
    except ValidationError:
        return {}
    return {("", kind, name): keys for (kind, name), keys in wanted_keys(env, env_from).items()}


def wanted_references(sandboxes: Sequence[Mapping[str, Any]]) -> Wanted:
    """The objects (and keys) the non-terminal sandboxes' environments reference."""
    wanted: Wanted = {}
    for sb in sandboxes:
        if (sb.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        namespace = sb["metadata"]["namespace"]
        for (_, kind, name), keys in env_references(sb.get("spec") or {}).items():
            target = (namespace, kind, name)
            before = wanted.get(target, set())
            wanted[target] = None if (keys is None or before is None) else before | keys
    return wanted


KEY_CACHE_MAX = 10_000
"""State keys a broker remembers (a key never changes once made); past it, it forgets
them all and reads them again."""


def node_state_keys(
    objects: Objects,
    namespace: str,
    node: str,
    sandboxes: Sequence[Mapping[str, Any]],
    known: dict[str, str] | None = None,
) -> dict[str, str]:
    """The state keys ``node`` may hold now (``policy.statekeys``), by brokered key;
    each made the first time a node needs it, and read once into ``known``."""
    known = {} if known is None else known
    snapshots = objects.list_node_snapshots(node)
    for sb in sandboxes:
        fork = ((sb.get("spec") or {}).get("snapshotRef") or {}).get("name")
        if fork and (shot := objects.get_snapshot(sb["metadata"]["namespace"], str(fork))):
            snapshots.append(shot)
    owners = sorted(node_keys(node, sandboxes, snapshots))
    if len(known) + len(owners) > KEY_CACHE_MAX:
        known.clear()
    for owner in owners:
        if owner not in known:
            known[owner] = ensure_key(objects.api, namespace, owner)
    return {brokered_state_key(owner): known[owner] for owner in owners}


def broker_node(
    objects: Objects,
    namespace: str,
    node: str,
    *,
    state_keys: bool = False,
    known: dict[str, str] | None = None,
) -> bool:
    """Make the node's brokered Secret hold its sandboxes' pull secrets, the keys
    their environments reference and (``state_keys``) the state keys it may hold
    (``known``: those read before); True if written."""
    api = objects.api
    data: dict[str, str] = {}
    sandboxes = objects.list_node_sandboxes(node)
    if state_keys:
        data.update(node_state_keys(objects, namespace, node, sandboxes, known))
    for ns, name in wanted_secrets(sandboxes):
        document = read_pull_secret(api, ns, name)
        if document is not None:
            data[brokered_key(ns, name)] = document
    for (ns, kind, name), keys in wanted_references(sandboxes).items():
        data[reference_key(ns, kind, name)] = encode(read_referenced(api, ns, kind, name, keys))
    current = brokered_data(api, namespace, node)
    if current == data or (current is None and not data):
        return False
    write_brokered(api, namespace, node, data)
    log.info("brokered %d secret(s) and reference(s) to node %s", len(data), node)
    return True


class PullCredentialBroker:
    """A sandbox-feed listener (on the event loop): a sandbox with pull secrets or
    environment references and a node re-brokers that node, on a thread of its own,
    so no request blocks the loop.

    Every replica follows the feed; only the leader brokers. The feed lists every
    sandbox as soon as a replica starts, usually before it leads, so what it saw
    while standing by is kept (``wanted``) and brokered when it becomes the leader.
    A node with a sandbox waiting for a referenced object or key
    (CreateContainerConfigError) is re-brokered every ``retry_interval`` seconds
    (the operator's ``env_reference_retry_interval``), so one created later
    reaches it; None: only events re-broker.
    """

    def __init__(
        self,
        objects: Objects,
        leading: Callable[[], bool],
        namespace: str,
        *,
        retry_interval: float | None = None,
        state_keys: bool = False,
    ) -> None:
        self.objects = objects
        self.leading = leading
        self.namespace = namespace
        # Every bound sandbox and snapshot brings its state key to its node, and takes
        # it away when it moves or ends (policy.statekeys).
        self.state_keys = state_keys
        # The node of each snapshot being taken (its key brokered there), by uid.
        self.snapshot_nodes: dict[str, tuple[str, bool]] = {}
        self._keys: dict[str, str] = {}  # state keys read (on the broker's one thread)
        # What each sandbox with pull secrets or references brings to its node (node,
        # what it names, terminal); its status writes change nothing of it.
        self.wanted: dict[str, tuple[str, tuple[str, ...], bool]] = {}
        # What this leader brokered for each: the same signature costs no request.
        self.brought: dict[str, tuple[str, tuple[str, ...], bool]] = {}
        # The node of each sandbox waiting for a referenced object or key.
        self.waiting: dict[str, str] = {}
        self._broker = ThreadPoolExecutor(1, thread_name_prefix="pull-credentials")
        self._stopped = threading.Event()
        if retry_interval is not None:
            threading.Thread(
                target=self._retry_waiting,
                args=(retry_interval,),
                name="env-references",
                daemon=True,
            ).start()

    def on_sandbox(self, event_type: str, body: Mapping[str, Any]) -> None:
        spec = body.get("spec") or {}
        references = env_references(spec)
        wants = spec.get("imagePullSecrets") or references or self.state_keys
        if not (wants and spec.get("nodeName")):
            return
        uid = str(body["metadata"]["uid"])
        node = str(spec["nodeName"])
        status = body.get("status") or {}
        named = tuple(str(r.get("name")) for r in spec.get("imagePullSecrets") or []) + tuple(
            f"_{kind}/{name}:{','.join(sorted(keys)) if keys is not None else '*'}"
            for (_, kind, name), keys in sorted(references.items())
        )
        if self.state_keys:
            named += (f"_state/{(spec.get('snapshotRef') or {}).get('name') or ''}",)
        signature = (node, named, status.get("phase") in TERMINAL_PHASES)
        nodes = [node]
        before = self.wanted.get(uid)
        if self.state_keys and before is not None and before[0] != node:
            nodes.append(before[0])  # moved: its old node loses its key
        if event_type == "DELETED":
            self.wanted.pop(uid, None)
            self.brought.pop(uid, None)
        else:
            self.wanted[uid] = signature
        if (
            event_type != "DELETED"
            and status.get("phase") in (None, SandboxPhase.PENDING, SandboxPhase.SCHEDULED)
            and status.get("reason") == SandboxReason.CREATE_CONTAINER_CONFIG_ERROR
        ):
            self.waiting[uid] = node
        else:
            self.waiting.pop(uid, None)
        if not self.leading() or self.brought.get(uid) == signature:
            return
        self.brought[uid] = signature  # one request per change, even before it is answered
        self._broker.submit(self._rebroker, nodes, [uid])

    def on_snapshot(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A SandboxSnapshot event (on the loop): one bound to a node and being taken
        brings its key there; Ready, Failed or deleted, the node loses it."""
        node = (body.get("spec") or {}).get("nodeName")
        if not (self.state_keys and node):
            return
        uid = str(body["metadata"]["uid"])
        ended = (
            event_type == "DELETED"
            or (body.get("status") or {}).get("phase") in TERMINAL_SNAPSHOT_PHASES
        )
        before = self.snapshot_nodes.get(uid)
        if event_type == "DELETED":
            self.snapshot_nodes.pop(uid, None)
        else:
            self.snapshot_nodes[uid] = (str(node), ended)
        if before == (str(node), ended):
            return
        if self.leading():
            self._broker.submit(self._rebroker, [str(node)], [])

    def on_leadership(self, leader: bool) -> None:
        """On the loop. A new leader brokers every node it saw a sandbox want
        credentials for; what it brokered as an earlier leader may be stale."""
        self.brought.clear()
        if not leader:
            return
        nodes = sorted(
            {signature[0] for signature in self.wanted.values()}
            | {node for node, ended in self.snapshot_nodes.values() if not ended}
        )
        self.brought.update(self.wanted)
        if nodes:
            self._broker.submit(self._rebroker, nodes, list(self.wanted))

    def close(self) -> None:
        self._stopped.set()
        self._broker.shutdown(wait=False, cancel_futures=True)

    def retry_waiting(self) -> list[str]:
        """Re-broker, as the leader, the node of each sandbox waiting for a referenced
        object or key; the nodes submitted. Raises RuntimeError once closed."""
        nodes = sorted(set(self.waiting.values()))
        if not nodes or not self.leading():
            return []
        self._broker.submit(self._rebroker, nodes, [])
        return nodes

    def _retry_waiting(self, interval: float) -> None:
        while not self._stopped.wait(interval):
            try:
                self.retry_waiting()
            except RuntimeError:  # closed meanwhile
                return

    def _rebroker(self, nodes: list[str], uids: list[str]) -> None:
        failed = []
        for node in nodes:
            try:
                broker_node(
                    self.objects,
                    self.namespace,
                    node,
                    state_keys=self.state_keys,
                    known=self._keys,
                )
            except Exception as e:
                log.warning("pull secrets not brokered to node %s: %s", node, e)
                failed.append(node)
        if failed:  # the next event of each of these sandboxes tries again
            for uid in uids:
                signature = self.brought.get(uid)
                if signature is not None and signature[0] in failed:
                    self.brought.pop(uid, None)


__all__ = [
    "PullCredentialBroker",
    "broker_node",
    "env_references",
    "node_state_keys",
    "wanted_references",
    "wanted_secrets",
]
