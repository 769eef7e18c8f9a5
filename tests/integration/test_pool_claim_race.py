"""A claim and a pool never both own a sandbox, against the real API server.

The pool controller (in-process, over the real API) plans to delete a member on a
scale to 0; between that plan and its delete, a claim takes the member as the
claim controller does (a metadata patch under the member's resourceVersion) and
is written Bound. The pool's delete must be refused (409) and the claim stay
Bound: a delete under the uid alone went through and left the claim Lost.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from sandlot.adapters.objects import Objects
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import CLAIM_LABEL, CLAIMED_FROM_LABEL, POOL_LABEL
from sandlot.controllers.liveness import LivenessView
from sandlot.controllers.metrics import WorkloadMetrics
from sandlot.controllers.settings import OperatorSettings
from sandlot.controllers.workloads import Workloads

pytestmark = pytest.mark.integration

POOL, CLAIM = "race", "taker"


def _body(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def test_a_member_claimed_between_the_pools_plan_and_its_delete_stays_with_the_claim(
    kube: client.ApiClient, namespace: str
) -> None:
    objs: Any = client.CustomObjectsApi(kube)
    ns = namespace
    pool = objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "sandboxpools",
        _body(
            "SandboxPool",
            POOL,
            {"replicas": 1, "template": {"spec": {"image": "registry.example/app:1"}}},
        ),
    )
    claim = objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, "sandboxclaims", _body("SandboxClaim", CLAIM, {"poolName": POOL})
    )
    w = Workloads.build(
        OperatorSettings(leader_election=False),
        Objects(kube),
        WorkloadMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        post_event=lambda *_: None,
        liveness=LivenessView(
            lambda: datetime.now(UTC),
            unseen_duration=timedelta(seconds=60),
            staleness_bound=timedelta(seconds=60),
        ),
    )
    # This test hands the controllers what they see itself: their caches are synced.
    w.cache.retain(set())
    w.claims.retain(set())
    w.listed.pending.clear()
    w.pools.on_pool(None, pool)
    asyncio.run(w.pools.queue.run_until_idle())
    created = objs.list_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes")["items"]
    assert len(created) == 1, f"the pool made {len(created)} members, not 1"
    member = created[0]["metadata"]["name"]

    # The claim takes the member the moment the pool is about to delete it.
    api = w.pools.api
    delete = api.delete_sandbox
    taken: list[str] = []

    def claim_then_delete(
        namespace: str, name: str, uid: str, resource_version: str | None = None
    ) -> bool:
        rec = next(m for m in w.cache.members(f"{ns}/{POOL}") if m.name == name)
        labels = {POOL_LABEL: None, CLAIM_LABEL: CLAIM, CLAIMED_FROM_LABEL: POOL}
        took = api.take_sandbox(namespace, name, str(rec.resource_version), {"labels": labels})
        assert took is not None, "the claim could not take the member"
        api.patch_claim_status(namespace, CLAIM, {"phase": "Bound", "sandboxName": name})
        taken.append(name)
        return delete(namespace, name, uid, resource_version)

    api.delete_sandbox = claim_then_delete  # type: ignore[method-assign]
    scaled = objs.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "sandboxpools", POOL, {"spec": {"replicas": 0}}
    )
    w.pools.on_pool("MODIFIED", scaled)
    retry = asyncio.run(w.pools.reconcile(f"{ns}/{POOL}"))

    assert taken == [member], "the pool never tried to delete the member: no race was run"
    try:
        left = objs.get_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes", member)
    except ApiException as e:
        assert e.status != 404, "the pool deleted a sandbox a claim had taken after its plan"
        raise
    assert left["metadata"].get("deletionTimestamp") is None, (
        "the pool deleted a sandbox a claim had taken after its plan"
    )
    assert left["metadata"]["labels"].get(CLAIM_LABEL) == CLAIM
    assert retry is not None, "a refused delete must bring the pool back to decide again"
    status = objs.get_namespaced_custom_object(GROUP, VERSION, ns, "sandboxclaims", CLAIM)
    assert status["status"]["phase"] == "Bound"
    assert claim["metadata"]["uid"] == status["metadata"]["uid"]
