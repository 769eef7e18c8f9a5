"""A pool's Service replaced over the one read: what is kept from it, what is the pool's."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.adapters.workloads import service_replacement
from sandlot.api.keys import SERVICE_MANAGED_BY_LABEL, SERVICE_MANAGER
from sandlot.controllers.routing import PoolRef, desired_service, owned_by

POOL = PoolRef("ns", "web", "uid-1", "web", ({"containerPort": 8080},))


def _seen(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": "ns",
            "resourceVersion": "41",
            "uid": "svc-uid",
            "labels": {"team": "web"},
            "annotations": {"example.test/note": "kept"},
            "managedFields": [{"manager": "kubectl"}],
            "ownerReferences": [{"uid": "uid-1", "kind": "SandboxPool", "name": "web"}],
        },
        "spec": {"clusterIP": "10.0.0.7", "clusterIPs": ["10.0.0.7"], **spec},
    }


def test_replacement_keeps_the_version_read_and_what_the_server_allocated() -> None:
    seen = _seen(ports=[{"port": 9090, "targetPort": 9090}, {"port": 8080}])
    out = service_replacement(seen, desired_service(POOL))
    meta = out["metadata"]
    assert meta["resourceVersion"] == "41" and meta["uid"] == "svc-uid"
    assert "managedFields" not in meta
    assert meta["labels"] == {
        "team": "web",
        "sandlot.dev/pool": "web",
        SERVICE_MANAGED_BY_LABEL: SERVICE_MANAGER,
    }
    assert meta["annotations"] == {"example.test/note": "kept"}
    assert out["spec"]["clusterIP"] == "10.0.0.7"
    assert [p["port"] for p in out["spec"]["ports"]] == [8080], "a dropped port must go"


@pytest.mark.parametrize(
    ("owners", "owned"),
    [
        ([{"uid": "uid-1"}], True),
        ([{"uid": "other"}, {"uid": "uid-1"}], True),
        ([{"uid": "other"}], False),
        (None, False),
    ],
    ids=["the-pool", "one-of-several", "someone-else", "no-owner"],
)
def test_owned_by_reads_owner_references(owners: list[dict[str, str]] | None, owned: bool) -> None:
    assert owned_by({"metadata": {"ownerReferences": owners}}, "uid-1") is owned
