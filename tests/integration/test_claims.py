"""SandboxClaims end to end: a real operator binds a claim at once to a warm
(Running) member of a pool served by a real agent; the member leaves the pool,
which replaces it; deleting the claim deletes its sandbox and container. Deleting
the pool ends its members and their containers (the garbage collector of the local
control plane) but not the claimed sandbox, whose deletion makes its claim Lost."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.api.common import GROUP, VERSION
from tests.support.pools import Cluster, Start, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def test_claim_is_bound_to_a_warm_member_which_the_pool_replaces(
    cluster: Cluster, operators: Start, kubectl
) -> None:
    node = cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("warm", 2)
    warm = {m["metadata"]["name"]: m for m in cluster.wait_running("warm", 2)}

    cluster.create_claim("mine", "warm")
    status = wait_for(
        lambda: (s := cluster.claim_status("mine")).get("phase") == "Bound" and s,
        timeout=10,
        what="claim mine to be Bound",
    )
    name = status["sandboxName"]
    assert name in warm, "bound to a member that was already Running"
    sandbox = cluster.objs.get_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "sandboxes", name
    )
    assert status["address"] == sandbox["status"]["ip"] and status["nodeName"] == node.name
    labels = sandbox["metadata"]["labels"]
    assert "sandlot.dev/pool" not in labels
    assert (labels["sandlot.dev/claim"], labels["sandlot.dev/claimed-from"]) == ("mine", "warm")
    assert sandbox["metadata"]["annotations"]["sandlot.dev/claimed-at"] == status["boundAt"]
    assert sandbox["status"]["phase"] == "Running"
    container = sandbox["status"]["containerId"]

    replaced = cluster.wait_running("warm", 2)
    assert name not in {m["metadata"]["name"] for m in replaced}
    out = kubectl("get", "sbclaim", "mine", "-n", cluster.namespace, "--no-headers").stdout
    assert out.split()[:4] == ["mine", "warm", "Bound", name], out

    cluster.objs.delete_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "sandboxclaims", "mine"
    )

    def sandbox_gone() -> bool:
        left = cluster.objs.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, "sandboxes", field_selector=f"metadata.name={name}"
        )["items"]
        return not left

    wait_for(sandbox_gone, timeout=15, what=f"sandbox {name} to go with its claim")
    wait_for(
        lambda: container not in node.containers(),
        timeout=20,
        what=f"container {container} to be stopped",
    )


def test_claim_on_a_pool_without_running_members_waits_saying_why(
    cluster: Cluster, operators: Start
) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_claim("early", "nopool")
    status = wait_for(
        lambda: (s := cluster.claim_status("early")).get("phase") == "Pending" and s,
        timeout=10,
        what="claim early to say it waits",
    )
    assert status["message"] == "pool nopool does not exist"
    cluster.create_pool("nopool", 1)
    wait_for(
        lambda: cluster.claim_status("early").get("phase") == "Bound",
        timeout=40,
        what="claim early to be bound once its pool has a Running member",
    )


def test_a_claimed_sandbox_outlives_its_pool_and_its_deletion_makes_the_claim_lost(
    cluster: Cluster, operators: Start
) -> None:
    node = cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("warm", 2)
    cluster.wait_running("warm", 2)
    cluster.create_claim("mine", "warm")
    claimed = wait_for(
        lambda: cluster.claim_status("mine").get("sandboxName"),
        timeout=10,
        what="claim mine to be Bound",
    )
    members = cluster.wait_running("warm", 2)  # the replacement too
    containers = {m["metadata"]["name"]: m["status"]["containerId"] for m in members}

    def sandbox(name: str) -> dict[str, Any] | None:
        found = cluster.objs.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, "sandboxes", field_selector=f"metadata.name={name}"
        )["items"]
        return found[0] if found else None

    kept = sandbox(claimed)
    assert kept is not None and kept["status"]["phase"] == "Running"
    cluster.objs.delete_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "sandboxpools", "warm"
    )
    wait_for(
        lambda: not any(sandbox(name) for name in containers),
        timeout=30,
        what=f"the pool's members {sorted(containers)} to go with it (garbage collector)",
    )
    wait_for(
        lambda: not set(containers.values()) & node.containers(),
        timeout=30,
        what="the pool's members' containers to be stopped",
    )
    after = sandbox(claimed)
    assert after is not None and after["status"]["phase"] == "Running", "the claim owns it"
    assert kept["status"]["containerId"] in node.containers()
    assert cluster.claim_status("mine")["phase"] == "Bound"

    cluster.objs.delete_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "sandboxes", claimed
    )
    status = wait_for(
        lambda: (s := cluster.claim_status("mine")).get("phase") == "Lost" and s,
        timeout=15,
        what="claim mine to say its sandbox is lost",
    )
    assert status["message"] == f"sandbox {claimed} was deleted"
