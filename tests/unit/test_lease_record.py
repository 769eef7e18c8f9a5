"""A Lease read from watch JSON is the same record the generated models give."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.objects import LeaseRecord, _lease_record, lease_record_of

RENEWED = {
    "metadata": {"name": "n1", "namespace": "sandlot-system", "resourceVersion": "4711",
                 "labels": {"sandlot.dev/agent-lease": "true"}},
    "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 15,
             "renewTime": "2026-11-30T20:41:00.123456Z",
             "acquireTime": "2026-11-30T20:00:00.000000Z", "leaseTransitions": 2},
}  # fmt: skip
FRESH = {"metadata": {"name": "n2", "resourceVersion": "9"}, "spec": {}}


def typed(body: dict[str, Any]) -> LeaseRecord:
    lease = client.ApiClient().deserialize(json.dumps(body), "V1Lease", "application/json")
    return _lease_record(lease)


@pytest.mark.parametrize("body", [RENEWED, FRESH], ids=["renewed", "never_renewed"])
def test_lease_from_json_equals_the_generated_models_reading(body: dict[str, Any]) -> None:
    assert lease_record_of(body) == typed(body)


def test_lease_from_json_keeps_the_renewal_to_the_microsecond() -> None:
    record = lease_record_of(RENEWED)
    assert record.renew_time == datetime(2026, 11, 30, 20, 41, 0, 123456, tzinfo=UTC)
    assert (record.holder, record.duration_seconds, record.transitions) == ("n1", 15, 2)
    assert record.resource_version == "4711"
