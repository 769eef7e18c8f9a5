"""``Client.claim`` against a real operator: the SDK's claim is bound by the
operator to a warm member of a pool served by a real agent, returned Running, and
released by leaving its ``with`` block (the claim deleted, and with it, by the
operator, its sandbox). The fixtures are the claim tests' (``tests/support/pools.py``);
no stream gateway runs here, so commands are tested in test_client_sdk.py."""

from __future__ import annotations

import time

import pytest

from sandlot.api.common import GROUP, VERSION
from sandlot.client import Client, TimedOut
from tests.support.pools import Cluster, Start, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def _names(c: Cluster, plural: str) -> set[str]:
    listed = c.objs.list_namespaced_custom_object(GROUP, VERSION, c.namespace, plural)
    return {item["metadata"]["name"] for item in listed["items"]}


def test_claim_is_bound_by_the_operator_and_released_with_its_block(
    cluster: Cluster, operators: Start
) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("warm", 2)
    warm = {m["metadata"]["name"] for m in cluster.wait_running("warm", 2)}

    with Client(cluster.kubeconfig, namespace=cluster.namespace) as sdk:
        with sdk.claim("warm", timeout=30) as sb:
            assert sb.name in warm, "bound to a member that was already Running"
            assert sb.phase == "Running" and sb.ip
            assert sb.claim in _names(cluster, "sandboxclaims")
            assert sdk.get(sb.name).claim == sb.claim, "get() lost the claim holding it"
        claim, name = sb.claim, sb.name
        wait_for(
            lambda: (
                claim not in _names(cluster, "sandboxclaims")
                and name not in _names(cluster, "sandboxes")
            ),
            timeout=20,
            what=f"claim {claim} and its sandbox {name} to be released",
        )

        # A pool with no member to give: the wait ends at its deadline, saying what it
        # saw, and leaves no claim behind.
        began = time.monotonic()
        with pytest.raises(TimedOut, match="Pending"):
            sdk.claim("nopool", timeout=3)
        assert time.monotonic() - began < 10
        assert not {n for n in _names(cluster, "sandboxclaims") if n.startswith("nopool-")}
