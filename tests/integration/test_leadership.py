"""Only the leader writes, and it stops before anyone else can start: a leader frozen
(SIGSTOP) in the middle of marking a lost node's sandboxes Dead, a standby that
takes over and finishes, then the old leader let go. The API server's own audit
log counts every write by who sent it (each replica's User-Agent names it) and
how it was answered.

The replicas run as the chart runs them, under its leader fence (pod-bound tokens,
identities their pods' names): the freeze can land between the old leader's own
fence check and its send, and then only the API server can refuse that write
(``tests/integration/test_leader_fence_pause.py`` lands it there on purpose)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.objects import Leases
from sandlot.api.leaderfence import HOLDER_RULE
from sandlot.devtools.controlplane import ControlPlane, helm_path, kubectl_path
from tests.support.chart import Installed, hook_of, operator_replica, render, sa_kubeconfig
from tests.support.kube import start_private_plane
from tests.support.operator import Fleet, OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: "sandlot.dev"
- level: None
"""

SANDBOXES = 400
NAMESPACE = "sandlot-system"
KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
FENCE = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@pytest.fixture
def audited_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    policy = tmp_path / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    plane = start_private_plane(
        tmp_path / "cp",
        extra_flags=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={tmp_path / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ],
        namespaces=("work", "sandlot-system"),
    )
    yield plane
    plane.stop()


def install_fence(plane: ControlPlane, fleet: Fleet, tmp_path: Path) -> Installed:
    """The chart's RBAC and leader fence (release ``sl``), in effect before it returns;
    the leader Lease is created free, so the first replica takes it at once."""
    docs = [
        d
        for d in render(helm_path(), "--set", "admissionPolicy.enabled=false", namespace=NAMESPACE)
        if not hook_of(d)
        and (
            d["kind"] in KINDS or (d["kind"] in FENCE and d["metadata"]["name"].endswith("-fence"))
        )
    ]
    assert sum(d["kind"] in FENCE for d in docs) == 2, "the chart renders no leader fence"
    subprocess.run(
        [str(kubectl_path()), "--kubeconfig", str(plane.kubeconfig), "apply", "-f", "-"],
        input=yaml.safe_dump_all(docs),
        text=True,
        capture_output=True,
        timeout=60,
        check=True,
    )
    installed = Installed("sl", NAMESPACE, docs)
    Leases(fleet.api, NAMESPACE).create(
        "sandlot-operator", holder="", duration_seconds=12, now=datetime.now(UTC)
    )
    probe = fleet.sandbox("fence-probe", "nowhere", "Running")
    config = sa_kubeconfig(fleet.api, plane, installed, "operator", tmp_path / "unbound")
    unbound = load_api_client(str(config))

    def refused() -> bool:
        try:
            client.CustomObjectsApi(unbound).patch_namespaced_custom_object_status(
                "sandlot.dev", "v1alpha1", fleet.namespace, "sandboxes", probe, {"status": {}}
            )
        except ApiException as e:
            return bool(e.status == 403)
        return False

    wait_for(refused, timeout=30, interval=0.3, what="the leader fence to take effect")
    unbound.close()
    client.CustomObjectsApi(fleet.api).delete_namespaced_custom_object(
        "sandlot.dev", "v1alpha1", fleet.namespace, "sandboxes", probe
    )
    return installed


def admitted(event: dict[str, Any]) -> bool:
    return int(event.get("responseStatus", {}).get("code", 0)) < 300


def audited_writes(log: Path) -> list[dict[str, Any]]:
    """Every write to a sandlot object the API server answered, in arrival order."""
    events = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("stage") == "ResponseComplete":
            events.append(event)
    return sorted(events, key=lambda e: e["requestReceivedTimestamp"])


def sent_by(event: dict[str, Any], op: OperatorProcess) -> bool:
    return f"({op.identity})" in event.get("userAgent", "")


def received(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def test_a_frozen_leader_mid_marking_writes_nothing_once_its_successor_has(
    audited_plane: ControlPlane, tmp_path: Path
):
    api = load_api_client(str(audited_plane.kubeconfig), pool_size=32)
    fleet = Fleet(api, "work", "sandlot-system")
    lost = fleet.node("lost")
    lease = fleet.lease(lost, duration=2)
    names = [fleet.sandbox(f"s{i}", lost, "Running") for i in range(SANDBOXES)]
    flags = ("--grace-period", "2s", "--resync-interval", "1s", "--mark-concurrency", "1")
    installed = install_fence(audited_plane, fleet, tmp_path)

    def replica() -> OperatorProcess:
        config, identity = operator_replica(api, audited_plane, installed, tmp_path)
        return OperatorProcess(
            audited_plane, tmp_path, NAMESPACE, *flags, kubeconfig=config, identity=identity
        )

    old = replica()
    new: OperatorProcess | None = None
    frozen = False
    try:
        old.wait_metrics()
        wait_for(old.is_leader, timeout=30, what="the first operator to lead")
        new = replica()
        new.wait_metrics()
        wait_for(
            lambda: fleet.get_node(lost).get("status", {}).get("phase") == "Ready",
            timeout=20,
            what="the node Ready first",
        )
        lease.pause()
        lease.stop()
        # Freeze the leader once its marking is under way, with most marks still to go:
        # it marks in list order (by name), one at a time, so s0 goes first.
        wait_for(
            lambda: fleet.phase(names[0]) == "Dead",
            timeout=30,
            interval=0.005,
            what="the leader to begin marking",
        )
        os.kill(old.proc.pid, signal.SIGSTOP)
        frozen = True
        dead_when_frozen = sum(fleet.phase(n) == "Dead" for n in names)
        assert 0 < dead_when_frozen < SANDBOXES, (
            f"the leader was frozen with {dead_when_frozen} of {SANDBOXES} marked: not mid-marking"
        )
        successor = new
        wait_for(successor.is_leader, timeout=40, what="the standby to take over")
        wait_for(
            lambda: all(fleet.phase(n) == "Dead" for n in names),
            timeout=90,
            interval=0.5,
            what="the new leader to finish marking",
        )
        # Let the old leader go: its in-flight pass and its queue wake up with it.
        os.kill(old.proc.pid, signal.SIGCONT)
        frozen = False
        wait_for(lambda: not old.is_leader(), timeout=20, what="the old leader to step down")
        wait_for(lambda: fleet.health(lost).get("handledAt"), timeout=30, what="the latch set")

        writes = audited_writes(tmp_path / "audit.log")
        by_old = [e for e in writes if sent_by(e, old) and admitted(e)]
        by_new = [e for e in writes if sent_by(e, successor) and admitted(e)]
        assert by_old, "the old leader never wrote: the test froze nothing"
        assert by_new, "the new leader never wrote"
        first_new = received(by_new[0])
        late = [
            (e["requestReceivedTimestamp"], e["verb"], e["objectRef"].get("name"))
            for e in by_old
            if received(e) >= first_new
        ]
        assert not late, (
            f"{len(late)} writes of the old leader landed after its successor's first "
            f"({first_new.isoformat()}): {late[:5]}\n{old.log()}"
        )
        # A write the freeze caught past the old leader's own check may still reach
        # the server after that: the leader fence refuses it, naming the rule (or its
        # resourceVersion is refused first, as a conflict).
        refused = [
            e.get("responseStatus", {})
            for e in writes
            if sent_by(e, old) and not admitted(e) and received(e) >= first_new
        ]
        for status in refused:
            fenced = status.get("code") == 403 and HOLDER_RULE in status.get("message", "")
            assert fenced or status.get("code") == 409, status
        assert old.proc.poll() is None, f"the old leader died:\n{old.log()}"
    finally:
        if frozen:
            os.kill(old.proc.pid, signal.SIGCONT)
        old.stop()
        if new is not None:
            new.stop()
        fleet.cleanup()
        api.close()
