"""The leader fence (``sandlot.api.leaderfence``) on the real API server.

The chart's ServiceAccounts, RBAC and leader fence are applied as rendered, with a
leader Lease of the release's own. Each operator replica is a Pod object of the
operator's ServiceAccount (no kubelet runs it: the Pod is what its token is bound
to, and the API server puts the Pod's name into the token's user info); the Pod's
name is the replica's leader-election identity, as the chart sets it.

The last test is the hole the fence closes: a leader whose own fence judged a
write allowed, then paused before sending it (a test seam at the fence's own
check, where a SIGSTOP would land), wakes after its successor took over and wrote;
the server must refuse the late write although the Sandbox did not change.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandlot.adapters.kube import RequestCounter, WriteFence, load_api_client
from sandlot.adapters.leader import LeaderElector
from sandlot.adapters.objects import Leases, Objects, dead_status
from sandlot.adapters.statuswrite import WriteOutcome, WriteResult, write_status
from sandlot.api.common import API_VERSION, GROUP, VERSION
from sandlot.api.leaderfence import CHART_TEMPLATE, HOLDER_RULE, leader_fence_policy
from sandlot.api.writepolicy import Identities
from sandlot.devtools.controlplane import ControlPlane, helm_path
from tests.support.chart import (
    Installed,
    apply,
    hook_of,
    operator_replica,
    render,
    sa_kubeconfig,
)
from tests.support.kube import Kubectl
from tests.support.operator import Fleet, OperatorProcess, wipe_nodes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
NODE = "fence-node"


@dataclass
class Release:
    installed: Installed
    ids: Identities
    kube: client.ApiClient
    plane: ControlPlane
    workdir: Path
    tenant: str  # a namespace for Sandboxes

    @property
    def lease(self) -> str:
        return self.ids.leader_lease

    def replica(
        self, pod: str, *, fence: WriteFence | None = None, counter: RequestCounter | None = None
    ) -> client.ApiClient:
        """An API client of the operator replica ``pod``: a token bound to a Pod of
        that name (created at its first client), as the kubelet mounts into the
        operator's container."""
        path = self.workdir / f"{pod}.kubeconfig"
        if not path.exists():
            sa_kubeconfig(self.kube, self.plane, self.installed, "operator", path, pod_name=pod)
        return load_api_client(str(path), fence=fence, counter=counter)

    def hold(self, holder: str | None) -> None:
        """Make ``holder`` the Lease's holder (None: no Lease at all), as a takeover would."""
        leases = Leases(self.kube, self.ids.namespace)
        record = leases.get(self.lease)
        if holder is None:
            if record is not None:
                client.CoordinationV1Api(self.kube).delete_namespaced_lease(
                    self.lease, self.ids.namespace
                )
            return
        now = datetime.now(UTC)
        if record is None:
            leases.create(self.lease, holder=holder, duration_seconds=12, now=now)
        else:
            leases.update(record, holder=holder, duration_seconds=12, renew_time=now)


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body)


def _refused(call: Callable[[], object]) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, _message(info.value)
    return _message(info.value)


def _sandbox(kube: client.ApiClient, namespace: str, name: str, phase: str = "Running") -> dict:
    objs: Any = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": API_VERSION,
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "sandlot.test/busybox:1", "nodeName": NODE},
    }
    objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", body)
    return dict(
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "sandboxes", name, {"status": {"phase": phase}}
        )
    )


def _patch_status(api: client.ApiClient, namespace: str, name: str, status: dict) -> Any:
    return client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxes", name, {"status": status}
    )


@pytest.fixture(scope="module")
def release(
    kube: client.ApiClient,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart's identities, RBAC and leader fence for a fresh release and Lease."""
    suffix = uuid.uuid4().hex[:6]
    name, namespace, lease = f"lf{suffix}", f"lf-{suffix}", f"leader-{suffix}"
    tenant = f"lft-{suffix}"
    core = client.CoreV1Api(kube)
    for ns in (namespace, tenant):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    args = (
        "--set",
        "admissionPolicy.enabled=false,placementPolicy.enabled=false,"
        f"operator.leaderElection.leaseName={lease}",
    )
    docs = [
        d
        for d in render(helm_path(), *args, release=name, namespace=namespace)
        if not hook_of(d) and d["kind"] in KINDS
    ]
    ids = Identities(
        fullname=f"{name}-sandlot",
        namespace=namespace,
        agent_service_account=f"{name}-sandlot-agent",
        operator_service_account=f"{name}-sandlot-operator",
        leader_lease=lease,
    )
    template = CHART_TEMPLATE.removeprefix("charts/sandlot/")
    only = render(helm_path(), *args, "--show-only", template, release=name, namespace=namespace)
    fence = [d for d in only if d["kind"] in POLICY_KINDS]
    assert fence == leader_fence_policy(ids), (
        f"{CHART_TEMPLATE} renders other objects than sandlot.api.leaderfence"
    )
    docs += fence
    apply(kubectl, docs)
    installed = Installed(name, namespace, docs)
    rel = Release(
        installed, ids, kube, control_plane, tmp_path_factory.mktemp("leader-fence"), tenant
    )
    # The fence takes effect once the API server has compiled it: wait for its first refusal.
    rel.hold("nobody-yet")
    _sandbox(kube, tenant, "probe")
    config = sa_kubeconfig(kube, control_plane, installed, "operator", rel.workdir / "unbound")
    unbound = load_api_client(str(config))

    def refused() -> bool:
        try:
            _patch_status(unbound, tenant, "probe", {"reason": "probe"})
        except ApiException as e:
            assert e.status == 403 and "operator-bound-token" in _message(e), _message(e)
            return True
        return False

    wait_for(refused, timeout=30, interval=0.3, what="the leader fence to take effect")
    unbound.close()
    yield rel
    kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )
    for ns in (namespace, tenant):
        core.delete_namespace(ns)


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:6]


def _admitted_once_seen(api: client.ApiClient, release: Release, name: str) -> Any:
    """The holder's write, once the API server's copy of the Lease names it (it trails
    a change of holder by milliseconds)."""

    def write() -> Any:
        try:
            return _patch_status(api, release.tenant, name, {"reason": "held"})
        except ApiException as e:
            if e.status == 403 and HOLDER_RULE in _message(e):
                return None
            raise

    return wait_for(write, timeout=10, interval=0.05, what="the holder's write to be admitted")


def test_the_lease_holders_writes_are_admitted(release: Release, tag: str) -> None:
    holder = f"op-a-{tag}"
    release.hold(holder)
    api = release.replica(holder)
    _sandbox(release.kube, release.tenant, f"sb-{tag}")
    _admitted_once_seen(api, release, f"sb-{tag}")
    got = _patch_status(api, release.tenant, f"sb-{tag}", {"phase": "Dead", "reason": "NodeLost"})
    assert got["status"]["phase"] == "Dead"
    api.close()


def test_a_replica_not_holding_the_lease_is_refused_naming_rule_holder_and_caller(
    release: Release, tag: str
) -> None:
    holder, other = f"op-a-{tag}", f"op-b-{tag}"
    release.hold(holder)
    admitted, refused = release.replica(holder), release.replica(other)
    _sandbox(release.kube, release.tenant, f"sb-{tag}")
    _admitted_once_seen(admitted, release, f"sb-{tag}")
    message = _refused(
        lambda: _patch_status(refused, release.tenant, f"sb-{tag}", {"phase": "Dead"})
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
    message = _refused(
        lambda: client.CustomObjectsApi(refused).create_namespaced_custom_object(
            GROUP, VERSION, release.tenant, "sandboxes", body
        )
    )
    assert f"rule {HOLDER_RULE}:" in message, message
    admitted.close()
    refused.close()


def test_a_token_not_bound_to_a_pod_is_refused_naming_the_rule(release: Release, tag: str) -> None:
    _sandbox(release.kube, release.tenant, f"sb-{tag}")
    path = release.workdir / f"unbound-{tag}"
    api = load_api_client(
        str(sa_kubeconfig(release.kube, release.plane, release.installed, "operator", path))
    )
    message = _refused(lambda: _patch_status(api, release.tenant, f"sb-{tag}", {"phase": "Dead"}))
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
    _sandbox(release.kube, release.tenant, f"sb-{tag}")
    _admitted_once_seen(api, release, f"sb-{tag}")
    release.hold(None)

    def created() -> dict[str, Any] | None:
        try:
            return _sandbox(release.kube, release.tenant, f"tenant-{tag}")
        except ApiException as e:
            assert e.status == 422 and "no params found" in _message(e), _message(e)
            return None

    wait_for(created, timeout=10, what="a tenant's Sandbox to be admitted without a Lease")
    got = _patch_status(api, release.tenant, f"sb-{tag}", {"reason": "no-lease"})
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
    _sandbox(release.kube, release.tenant, f"sb-{tag}")
    _admitted_once_seen(old_api, release, f"sb-{tag}")
    release.hold(new)
    got = _patch_status(new_api, release.tenant, f"sb-{tag}", {"reason": "new-leader"})
    assert got["status"]["reason"] == "new-leader"
    # The server has seen the takeover: the old holder is refused at once, not eventually.
    message = _refused(
        lambda: _patch_status(old_api, release.tenant, f"sb-{tag}", {"phase": "Dead"})
    )
    assert f"held by {new}" in message and f"from pod {old}" in message, message
    assert sum(counter.calls.values()) == sum(counter.fenced.values()) + 1
    old_api.close()
    new_api.close()


class PauseAfterCheck:
    """The client fence's check, then a pause before the send, as a SIGSTOP landing
    between the two would: once armed, the next check that passes holds its thread
    (with its verdict already given) until released."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self.check = check
        self.armed = threading.Event()
        self.paused = threading.Event()
        self.released = threading.Event()

    def __call__(self) -> bool:
        verdict = self.check()
        if verdict and self.armed.is_set():
            self.armed.clear()
            self.paused.set()
            if not self.released.wait(60):
                raise AssertionError("the paused write was never released")
        return verdict


def _elector(release: Release, api: client.ApiClient, identity: str) -> LeaderElector:
    return LeaderElector(
        api,
        namespace=release.ids.namespace,
        name=release.lease,
        identity=identity,
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )


def test_a_leader_paused_between_its_fence_and_its_send_is_refused_by_the_server(
    release: Release, tag: str
) -> None:
    old_id, new_id = f"op-old-{tag}", f"op-new-{tag}"
    release.hold(None)
    old_election, new_election = release.replica(old_id), release.replica(new_id)
    old = _elector(release, old_election, old_id)
    new = _elector(release, new_election, new_id)
    pause = PauseAfterCheck(old.leading)
    old_counter, new_counter = RequestCounter(), RequestCounter()
    old_api = release.replica(old_id, fence=WriteFence(pause), counter=old_counter)
    new_api = release.replica(new_id, fence=WriteFence(new.leading), counter=new_counter)
    live, first, other = (f"{n}-{tag}" for n in ("live", "first", "other"))
    for name in (live, first, other):
        _sandbox(release.kube, release.tenant, name)
    marks: list[WriteResult] = []

    def mark(api: client.ApiClient, name: str) -> WriteResult:
        obj = Objects(api).get_sandbox(release.tenant, name)
        return write_status(
            Objects(api), obj, dead_status("NodeLost", "lost", datetime.now(UTC)), node=NODE
        )

    try:
        old.start()
        wait_for(old.leading, timeout=15, what="the first replica to lead")
        assert mark(old_api, first).outcome == WriteOutcome.WRITTEN
        assert sum(old_counter.calls.values()) >= 1
        # Its next mark passes the client fence, then the replica freezes before sending.
        before = dict(Objects(release.kube).get_sandbox(release.tenant, live))
        pause.armed.set()
        marking = threading.Thread(target=lambda: marks.append(mark(old_api, live)))
        marking.start()
        assert pause.paused.wait(15), "the old leader's mark never reached its fence"
        old.stop(release=False)  # a frozen process renews nothing
        new.start()
        wait_for(new.leading, timeout=20, what="the standby to take over")
        lease = Leases(release.kube, release.ids.namespace).get(release.lease)
        assert lease is not None and lease.holder == new_id, lease
        assert mark(new_api, other).outcome == WriteOutcome.WRITTEN
        # The Sandbox the old leader is about to mark never changed: its
        # resourceVersion precondition still holds, only the server's fence can refuse.
        still = Objects(release.kube).get_sandbox(release.tenant, live)
        assert still["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        sent_before = old_counter.snapshot()
        pause.released.set()
        marking.join(30)
        assert not marking.is_alive(), "the old leader's mark never came back"
    finally:
        pause.released.set()
        old.stop(release=False)
        new.stop()
    (result,) = marks
    after = Objects(release.kube).get_sandbox(release.tenant, live)
    assert after["status"]["phase"] == "Running", (
        f"the old leader's late mark landed: {after['status']} ({result})"
    )
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert result.outcome == WriteOutcome.FAILED and "leader fence refused" in result.detail, result
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{release.tenant}/sandboxes/{live}/status"

    def to_live(calls: Counter[tuple[str, str]]) -> int:
        return sum(n for (verb, url), n in calls.items() if verb == "PATCH" and url.endswith(path))

    # It was sent (the client fence had let it through), refused once, never resent.
    assert to_live(old_counter.calls) == to_live(sent_before) + 1 == 1
    assert to_live(old_counter.fenced) == 1
    for api in (old_api, new_api, old_election, new_election):
        api.close()


FAST_ELECTION = (
    "--grace-period",
    "2s",
    "--resync-interval",
    "1s",
    "--leader-lease-duration",
    "3s",
    "--leader-renew-deadline",
    "2s",
    "--leader-retry-period",
    "0.5s",
)


def test_a_standby_that_takes_over_from_a_killed_leader_marks_through_the_fence(
    release: Release, tmp_path: Path
) -> None:
    """Two ``sandlot operator`` processes as the chart runs them (pod-bound tokens,
    identities their pods' names): the leader is killed, the standby takes the Lease
    and its markings are admitted, its first writes resent if the API server's copy
    of the Lease still named the dead leader."""
    wipe_nodes(release.kube)
    release.hold(None)
    fleet = Fleet(release.kube, release.tenant, release.ids.namespace)
    ops: list[OperatorProcess] = []

    def operator() -> OperatorProcess:
        config, identity = operator_replica(
            release.kube, release.plane, release.installed, tmp_path
        )
        op = OperatorProcess(
            release.plane,
            tmp_path,
            release.ids.namespace,
            *FAST_ELECTION,
            "--leader-lease-name",
            release.lease,
            kubeconfig=config,
            identity=identity,
        )
        ops.append(op)
        op.wait_metrics()
        return op

    try:
        node = fleet.node("n1")
        lease = fleet.lease(node)
        fleet.sandbox("first", node, "Running")
        leader = operator()
        wait_for(leader.is_leader, timeout=30, what="the first operator to lead")
        standby = operator()
        wait_for(
            lambda: fleet.get_node(node).get("status", {}).get("phase") == "Ready",
            timeout=30,
            what="the node Ready under the first leader",
        )
        leader.kill()  # no release: the standby waits out the Lease
        wait_for(standby.is_leader, timeout=30, what="the standby to take over")
        held = Leases(release.kube, release.ids.namespace).get(release.lease)
        assert held is not None and held.holder == standby.identity, held
        lease.pause()
        wait_for(
            lambda: fleet.phase("first") == "Dead",
            timeout=40,
            what="the new leader to mark the lost node's sandbox Dead",
        )
        assert fleet.get("first")["status"]["reason"] == "NodeLost"
        assert (
            "ServerFenced" not in standby.log()
            and "leader fence: the API server refused" not in (standby.log())
        ), standby.log()
    finally:
        for op in ops:
            op.stop()
        fleet.cleanup()
