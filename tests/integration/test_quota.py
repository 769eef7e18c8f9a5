"""A namespace's count of sandlot objects is bounded by an ordinary ResourceQuota,
against the real API server: object-count quota (``count/<plural>.sandlot.dev``)
works for custom resources, so no sandlot code is involved, only what
docs/isolation.md tells an administrator to write.

No kube-controller-manager runs here: its quota controller's part (publishing
``status.hard`` and the usage it counted) is written by the test, as the
controller would; the API server's quota admission does the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

QUOTA = "count/sandboxclaims.sandlot.dev"


def test_claims_past_the_namespaces_quota_are_refused_naming_it(
    kube: client.ApiClient, namespace: str
) -> None:
    core: Any = client.CoreV1Api(kube)  # bodies as plain JSON
    core.create_namespaced_resource_quota(
        namespace,
        {"metadata": {"name": "sandboxes"}, "spec": {"hard": {QUOTA: "2"}}},
    )
    core.patch_namespaced_resource_quota_status(
        "sandboxes", namespace, {"status": {"hard": {QUOTA: "2"}, "used": {QUOTA: "0"}}}
    )
    objs = client.CustomObjectsApi(kube)

    def cached(used: str) -> None:
        """Wait until the API server's watch cache (what its quota admission reads,
        through an informer) holds the quota with ``used`` counted: an admission
        judging a quota it has not seen yet would count from a stale usage."""

        def seen() -> bool:
            found = core.list_namespaced_resource_quota(namespace, resource_version="0").items
            if len(found) != 1:
                return False
            status = found[0].status
            return (
                status is not None and bool(status.hard) and (status.used or {}).get(QUOTA) == used
            )

        wait_for(seen, timeout=30, what=f"the watch cache's quota with {used} used")

    def claim(name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"poolName": "python"},
        }
        objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxclaims", body)

    cached("0")
    claim("one")
    cached("1")
    claim("two")
    cached("2")
    with pytest.raises(client.ApiException) as refused:
        claim("three")
    assert refused.value.status == 403, refused.value
    assert "exceeded quota" in str(refused.value.body) and QUOTA in str(refused.value.body)
    used = core.read_namespaced_resource_quota("sandboxes", namespace).status.used
    assert used == {QUOTA: "2"}, used
