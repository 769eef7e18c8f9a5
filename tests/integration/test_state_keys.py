"""A node reaches only the suspended state of sandboxes it runs, and deletes none.

The rig of tests/integration/test_state_move.py: a real operator process, real
agents on their own containerd namespaces, the loopback registry behind htpasswd
(one credential every agent holds, as the chart mounts it). Node b plays the
compromised node: with everything it holds (the registry credential, its own
node identity and the keys brokered to it) it cannot open the state of a sandbox
suspended on node a, nor read a's brokered Secret; once the sandbox is moved to
b, b gets its key and a loses it. Deleting is the operator's: with its delete
credential refused, a deleted sandbox's state stays in the registry though every
node holds a credential that could delete it, and its key goes all the same.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.pulling.sealed import SEALED_MANIFEST
from sandlot.adapters.pullsecrets import NodeIdentity, brokered_secret_name, read_brokered
from sandlot.adapters.runtime import NotFound
from sandlot.agent.main import Agent
from sandlot.agent.statestore import StateStore
from sandlot.api.common import GROUP, VERSION
from sandlot.policy.statekeys import brokered_key, key_secret_name
from tests.integration.test_state_move import (
    create,
    get,
    manifest_gone,
    moving,
    running_with_file,
    set_mode,
    started_and_rewritten,
    state_registry,
    suspended,
)
from tests.support.pools import Cluster, LocalNode, Start, node_of, start_operator
from tests.support.registry import AUTH_USER, Registry
from tests.support.wait import wait_for

pytest_plugins = ["tests.support.registry"]
pytestmark = [pytest.mark.containerd, pytest.mark.integration]

__all__ = ["moving"]  # a fixture, imported by name


def store_of(node: LocalNode) -> StateStore:
    agent: Agent | None = node.agent
    assert agent is not None and agent._parts is not None
    store = agent._parts.sync.suspensions.store
    assert store is not None, f"{node.name} has no state repository"
    return store


def brokered_to(c: Cluster, node: LocalNode) -> dict[str, str]:
    """``node``'s brokered Secret, read as that node's own identity."""
    identity = NodeIdentity(c.kube, c.lease_namespace, node.name)
    return read_brokered(identity.client(), c.lease_namespace, node.name) or {}


def key_secret(c: Cluster, owner: str) -> Any:
    try:
        return client.CoreV1Api(c.kube).read_namespaced_secret(
            key_secret_name(owner), c.lease_namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def suspended_on_a(c: Cluster, name: str, a: LocalNode) -> tuple[str, dict[str, Any]]:
    sb = started_and_rewritten(c, name, a)
    uid = str(sb["metadata"]["uid"])
    set_mode(c, name, "Suspended")
    state: dict[str, Any] = wait_for(
        lambda: get(c, name).get("status", {}).get("suspendedState"),
        timeout=60,
        what=f"{name}'s state pushed",
    )
    wait_for(lambda: not a.containers(), timeout=20, what="the container removed on a")
    return uid, state


def test_another_node_cannot_open_a_suspended_sandboxs_state_until_it_is_moved_there(
    moving: Cluster, operators: Start, auth_registry: Registry
) -> None:
    a, b = moving.add_node("a"), moving.add_node("b")
    start_operator(moving, operators)
    create(moving, "bystander", b.name)  # b runs a tenant of its own: it holds keys
    create(moving, "victim", a.name)
    uid, state = suspended_on_a(moving, "victim", a)
    bystander = str(get(moving, "bystander")["metadata"]["uid"])
    wait_for(
        lambda: brokered_key(bystander) in brokered_to(moving, b),
        timeout=20,
        what="b's own sandbox's key brokered to b",
    )

    # The registry (every node's credential) holds a sealed manifest, no image config.
    registry = state_registry(auth_registry)
    try:
        wrapper = json.loads(registry.manifest(state["digest"])[0])
    finally:
        registry.close()
    assert wrapper["config"]["mediaType"] == SEALED_MANIFEST, wrapper

    # a holds the key; b holds none, and b's identity cannot read a's brokered Secret.
    assert brokered_key(uid) in brokered_to(moving, a)
    assert brokered_key(uid) not in brokered_to(moving, b)
    b_identity = NodeIdentity(moving.kube, moving.lease_namespace, b.name).client()
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(b_identity).read_namespaced_secret(
            brokered_secret_name(a.name), moving.lease_namespace
        )
    assert refused.value.status == 403
    with pytest.raises(RegistryError, match=f"no state key of {uid}"):
        store_of(b).pull(state["image"], "sandlot.local/stolen:latest", uid)
    assert b.runtime is not None
    with pytest.raises(NotFound):  # nothing of it landed in b's store
        b.runtime.image_config("sandlot.local/stolen:latest", timeout=5)

    # Moved to b: b gets the key, a loses it, and b runs it with its files.
    moving.objs.patch_cluster_custom_object(
        GROUP, VERSION, "sandboxnodes", a.name, {"spec": {"unschedulable": True}}
    )
    wait_for(lambda: node_of(get(moving, "victim")) == b.name, timeout=30, what="moved to b")
    assert suspended(get(moving, "victim")) == ("True", "Suspended")
    wait_for(
        lambda: brokered_key(uid) not in brokered_to(moving, a),
        timeout=20,
        what="the key taken from the node the sandbox left",
    )
    wait_for(
        lambda: brokered_key(uid) in brokered_to(moving, b),
        timeout=20,
        what="the key brokered to the node the sandbox moved to",
    )
    set_mode(moving, "victim", "Running")
    running_with_file(moving, "victim", b)


def test_nodes_delete_no_state_and_a_deleted_sandboxs_key_goes_with_it(
    moving: Cluster, operators: Start, auth_registry: Registry, tmp_path: Path
) -> None:
    """The operator's delete credential is refused here, while every node still holds
    one that deletes (the test registry's htpasswd grants its one user everything):
    a deleted sandbox's state stays, so no node deleted it; its key goes all the same,
    and nothing opens the state any more."""
    refused = tmp_path / "refused.json"
    auth = base64.b64encode(f"{AUTH_USER}:not-the-password".encode()).decode()
    refused.write_text(json.dumps({"auths": {auth_registry.host: {"auth": auth}}}))
    flags = list(moving.operator_flags)
    flags[flags.index("--state-auth-file") + 1] = str(refused)
    moving.operator_flags = tuple(flags)
    a = moving.add_node("a")
    operator = start_operator(moving, operators)
    create(moving, "gone", a.name)
    uid, state = suspended_on_a(moving, "gone", a)
    assert key_secret(moving, uid) is not None, "the operator made no key"

    moving.objs.delete_namespaced_custom_object(
        GROUP, VERSION, moving.namespace, "sandboxes", "gone"
    )
    said = f"pushed state {state['image']} not deleted"
    wait_for(
        lambda: said in operator.log_path.read_text(),
        timeout=30,
        what="the operator's refused delete",
    )
    wait_for(lambda: key_secret(moving, uid) is None, timeout=30, what="the key deleted")
    assert a.agent is not None and a.agent.sandbox_watch.get(f"{moving.namespace}/gone") is None
    assert not manifest_gone(auth_registry, state["digest"]), "a node deleted the state"
    with pytest.raises(RegistryError, match=f"no state key of {uid}"):
        store_of(a).pull(state["image"], "sandlot.local/after:latest", uid)
