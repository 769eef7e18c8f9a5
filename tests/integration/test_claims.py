"""SandboxClaims end to end: a real operator binds a claim at once to a warm
(Running) member of a pool served by a real agent; the member leaves the pool,
which replaces it; deleting the claim deletes its sandbox and container. Deleting
the pool ends its members and their containers (the garbage collector of the local
control plane) but not the claimed sandbox, whose deletion makes its claim Lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.controlplane import free_port
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


DOZY_PROBE = {
    "exec": {"command": ["sh", "-c", "true"]},
    "periodSeconds": 1,
    "timeoutSeconds": 2,
    "failureThreshold": 2,
}
IDLE_TIMEOUT = 8  # seconds: its first probe passes well before


def _condition(sb: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (sb.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return str(c.get("status")), str(c.get("reason"))
    return None


def test_a_claim_binds_an_idle_suspended_member_with_a_readiness_probe_and_wakes_it(
    cluster: Cluster, operators: Start, tmp_path: Path
) -> None:
    """A suspended member has no container to probe: its Ready verdict stands as
    last written (probes past its failureThreshold would have turned it False, and
    claims bind only Ready members), so a claim binds it and the agent starts it."""
    # The agent serves streams (no gateway here): the idle suspension and the claim's
    # wake are wired to its stream server. Its probe runs every second, and each exec
    # (runc's own start included) spends CPU in the member's cgroup: the idle
    # threshold is raised past that, as this test is not about the threshold.
    certs = StreamCerts.create(tmp_path / "certs", cluster.lease_namespace, ("127.0.0.1",))
    cluster.agent_overrides.update(
        idle_interval="0.3s",
        idle_cpu_cores=0.5,
        stream_port=free_port(),
        stream_bind="127.0.0.1",
        stream_tls_cert=str(certs.agent("a").cert),
        stream_tls_key=str(certs.agent("a").key),
        stream_client_ca=str(certs.ca.cert),
    )
    node = cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool(
        "dozy",
        1,
        readinessProbe=DOZY_PROBE,
        idleTimeoutSeconds=IDLE_TIMEOUT,
        idleAction="Suspend",
    )
    [member] = cluster.wait_running("dozy", 1)
    name, cid = member["metadata"]["name"], member["status"]["containerId"]

    def sandbox() -> dict[str, Any]:
        return dict(
            cluster.objs.get_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, "sandboxes", name
            )
        )

    wait_for(
        lambda: _condition(sandbox(), "Ready") == ("True", "ProbePassed"),
        timeout=IDLE_TIMEOUT,
        what=f"member {name} Ready before its idle timeout",
    )

    wait_for(
        lambda: _condition(sandbox(), "Suspended") == ("True", "Idle"),
        timeout=IDLE_TIMEOUT + 40,
        what=f"member {name} idle-suspended",
    )
    assert _condition(sandbox(), "Ready") == ("True", "ProbePassed"), sandbox()["status"]
    wait_for(lambda: cid not in node.containers(), timeout=20, what=f"container {cid} removed")
    agent = node.agent
    assert agent is not None
    key = f"{cluster.namespace}/{name}"
    wait_for(
        lambda: _condition(agent.sandbox_watch.get(key) or {}, "Suspended") == ("True", "Idle"),
        timeout=10,
        what="the agent's watch to see the idle suspension",
    )
    passes = agent.registry.get_sample_value("sandlot_agent_readiness_passes_total") or 0
    wait_for(  # 8 s of passes: past the probe's failureThreshold * periodSeconds + timeout
        lambda: (
            (agent.registry.get_sample_value("sandlot_agent_readiness_passes_total") or 0)
            >= passes + 16
        ),
        timeout=30,
        what="readiness passes over the suspended member",
    )
    assert _condition(sandbox(), "Ready") == ("True", "ProbePassed"), sandbox()["status"]

    cluster.create_claim("waker", "dozy")
    status = wait_for(
        lambda: (s := cluster.claim_status("waker")).get("phase") == "Bound" and s,
        timeout=15,
        what="claim waker to bind the idle-suspended member",
    )
    assert status["sandboxName"] == name
    wait_for(
        lambda: _condition(sandbox(), "Suspended") == ("False", "Restored"),
        timeout=30,
        what=f"member {name} started again for its claim",
    )
    woke = sandbox()
    assert woke["status"]["phase"] == "Running"
    assert woke["status"]["containerId"] in node.containers()
