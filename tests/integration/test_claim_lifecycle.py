"""A claim's lifecycle end to end, with a real operator and a real agent: at its
``shutdownTime`` policy Delete deletes the claim and its sandbox, Retain stops the
sandbox (ClaimExpired) and keeps the claim as Expired; a Lost claim is deleted
after its ``ttlSecondsAfterFinished``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sandlot.api.common import GROUP, VERSION
from sandlot.api.timestamps import parse_time, rfc3339
from tests.support.pools import Cluster, Start, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def read(c: Cluster, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(c.objs.get_namespaced_custom_object(GROUP, VERSION, c.namespace, plural, name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def wait_claim(c: Cluster, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = read(c, "sandboxclaims", name)
        status = (body or {}).get("status") or {}
        return status if status.get("phase") == phase else None

    return wait_for(probe, timeout=timeout, what=f"claim {name} to be {phase}")


def wait_gone(c: Cluster, plural: str, name: str, timeout: float = 60) -> None:
    wait_for(
        lambda: read(c, plural, name) is None, timeout=timeout, what=f"{plural} {name} deleted"
    )


def test_delete_and_retain_at_the_claims_shutdown_time(cluster: Cluster, operators: Start) -> None:
    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("warm", 2)
    cluster.wait_running("warm", 2)
    end = (datetime.now(UTC) + timedelta(seconds=30)).replace(microsecond=0)
    at = rfc3339(end).replace(".000000", "")
    cluster.create_claim("kept", "warm", {"shutdownTime": at})
    cluster.create_claim("gone", "warm", {"shutdownTime": at, "shutdownPolicy": "Delete"})
    kept = wait_claim(cluster, "kept", "Bound")["sandboxName"]
    gone = wait_claim(cluster, "gone", "Bound")["sandboxName"]

    status = wait_claim(cluster, "kept", "Expired")
    finished = parse_time(status["finishedAt"])
    assert finished is not None and finished >= end, status
    sandbox = read(cluster, "sandboxes", kept)
    assert sandbox is not None, f"Retain keeps sandbox {kept}"
    assert (sandbox["status"]["phase"], sandbox["status"]["reason"]) == ("Stopped", "ClaimExpired")

    wait_gone(cluster, "sandboxclaims", "gone")
    wait_gone(cluster, "sandboxes", gone)


def test_a_lost_claim_is_deleted_after_its_ttl_and_a_bad_policy_is_refused(
    cluster: Cluster, operators: Start
) -> None:
    with pytest.raises(ApiException) as refused:
        cluster.create_claim("bad", "warm", {"shutdownPolicy": "Sometimes"})
    assert refused.value.status == 422 and "shutdownPolicy" in str(refused.value.body)

    cluster.add_node("a", capacity=10)
    start_operator(cluster, operators)
    cluster.create_pool("warm", 1)
    cluster.wait_running("warm", 1)
    cluster.create_claim("brief", "warm", {"ttlSecondsAfterFinished": 5})
    name = wait_claim(cluster, "brief", "Bound")["sandboxName"]
    cluster.objs.delete_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "sandboxes", name
    )
    assert wait_claim(cluster, "brief", "Lost").get("finishedAt"), "finishedAt written"
    wait_gone(cluster, "sandboxclaims", "brief")
