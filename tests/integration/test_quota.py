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

    def claim(name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"poolName": "python"},
        }
        objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxclaims", body)

    claim("one")
    claim("two")
    with pytest.raises(client.ApiException) as refused:
        claim("three")
    assert refused.value.status == 403, refused.value
    assert "exceeded quota" in str(refused.value.body) and QUOTA in str(refused.value.body)
    used = core.read_namespaced_resource_quota("sandboxes", namespace).status.used
    assert used == {QUOTA: "2"}, used
