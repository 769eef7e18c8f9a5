"""The leader fence (``sandlot.api.leaderfence``) on the real API server, rule by
rule: the holder's writes admitted, a non-holder's and an unbound token's refused
naming the rule, no Lease, and a handover (``tests.support.leaderfence``)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import RequestCounter, WriteFence, load_api_client
from sandlot.api.common import API_VERSION, GROUP, VERSION
from sandlot.api.leaderfence import HOLDER_RULE
from tests.support.chart import sa_kubeconfig
from tests.support.leaderfence import (
    Release,
    admitted_once_seen,
    make_sandbox,
    message_of,
    patch_status,
    refused_with,
    release,
    tag,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration
__all__ = ["release", "tag"]  # fixtures


def test_the_lease_holders_writes_are_admitted(release: Release, tag: str) -> None:
    holder = f"op-a-{tag}"
    release.hold(holder)
    api = release.replica(holder)
    make_sandbox(release.kube, release.tenant, f"sb-{tag}")
    admitted_once_seen(api, release, f"sb-{tag}")
    got = patch_status(api, release.tenant, f"sb-{tag}", {"phase": "Dead", "reason": "NodeLost"})
    assert got["status"]["phase"] == "Dead"
    api.close()


def test_a_replica_not_holding_the_lease_is_refused_naming_rule_holder_and_caller(
    release: Release, tag: str
) -> None:
    holder, other = f"op-a-{tag}", f"op-b-{tag}"
    release.hold(holder)
    admitted, refused = release.replica(holder), release.replica(other)
    make_sandbox(release.kube, release.tenant, f"sb-{tag}")
    admitted_once_seen(admitted, release, f"sb-{tag}")
    message = refused_with(
        lambda: patch_status(refused, release.tenant, f"sb-{tag}", {"phase": "Dead"})
    )
    assert f"{release.ids.fullname}-leader-fence: rule {HOLDER_RULE}:" in message, message
    assert f"held by {holder}" in message and f"from pod {other}" in message, message
    assert f"sandboxes/status {release.tenant}/sb-{tag}" in message, message
    objs: Any = client.CustomObjectsApi(release.kube)
    got = objs.get_namespaced_custom_object(
        GROUP, VERSION, release.tenant, "sandboxes", f"sb-{tag}"
    )
    assert got["status"]["phase"] == "Running"
    # Its own creations too: only the leader creates Sandboxes (a pool's members).
    body = {
        "apiVersion": API_VERSION,
        "kind": "Sandbox",
        "metadata": {"name": f"new-{tag}"},
        "spec": {"image": "sandlot.test/busybox:1"},
    }
    message = refused_with(
        lambda: client.CustomObjectsApi(refused).create_namespaced_custom_object(
            GROUP, VERSION, release.tenant, "sandboxes", body
        )
    )
    assert f"rule {HOLDER_RULE}:" in message, message
    admitted.close()
    refused.close()


def test_a_token_not_bound_to_a_pod_is_refused_naming_the_rule(release: Release, tag: str) -> None:
    make_sandbox(release.kube, release.tenant, f"sb-{tag}")
    path = release.workdir / f"unbound-{tag}"
    api = load_api_client(
        str(sa_kubeconfig(release.kube, release.plane, release.installed, "operator", path))
    )
    message = refused_with(
        lambda: patch_status(api, release.tenant, f"sb-{tag}", {"phase": "Dead"})
    )
    assert f"{release.ids.fullname}-leader-fence: rule operator-bound-token:" in message, message
    assert "authentication.kubernetes.io/pod-name" in message, message
    api.close()


def test_without_a_lease_the_fence_stands_aside_for_every_identity(
    release: Release, tag: str
) -> None:
    """A binding whose parameter is missing is resolved before the policy's match
    conditions: denying would refuse every identity's writes of these kinds."""
    holder = f"op-a-{tag}"
    release.hold(holder)
    api = release.replica(holder)
    make_sandbox(release.kube, release.tenant, f"sb-{tag}")
    admitted_once_seen(api, release, f"sb-{tag}")
    release.hold(None)

    def created() -> dict[str, Any] | None:
        try:
            return make_sandbox(release.kube, release.tenant, f"tenant-{tag}")
        except ApiException as e:
            assert e.status == 422 and "no params found" in message_of(e), message_of(e)
            return None

    wait_for(created, timeout=10, what="a tenant's Sandbox to be admitted without a Lease")
    got = patch_status(api, release.tenant, f"sb-{tag}", {"reason": "no-lease"})
    assert got["status"]["reason"] == "no-lease"
    api.close()


def test_at_a_handover_the_old_holder_is_refused_once_the_new_ones_write_landed(
    release: Release, tag: str
) -> None:
    old, new = f"op-old-{tag}", f"op-new-{tag}"
    release.hold(old)
    counter = RequestCounter()
    old_api = release.replica(old)
    # The new holder writes as the operator does: through its fence, which resends a
    # holder-rule refusal while the server's copy of the Lease still trails.
    new_api = release.replica(new, fence=WriteFence(lambda: True), counter=counter)
    make_sandbox(release.kube, release.tenant, f"sb-{tag}")
    admitted_once_seen(old_api, release, f"sb-{tag}")
    release.hold(new)
    got = patch_status(new_api, release.tenant, f"sb-{tag}", {"reason": "new-leader"})
    assert got["status"]["reason"] == "new-leader"
    # The server has seen the takeover: the old holder is refused at once, not eventually.
    message = refused_with(
        lambda: patch_status(old_api, release.tenant, f"sb-{tag}", {"phase": "Dead"})
    )
    assert f"held by {new}" in message and f"from pod {old}" in message, message
    assert sum(counter.calls.values()) == sum(counter.fenced.values()) + 1
    old_api.close()
    new_api.close()
