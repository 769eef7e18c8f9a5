"""Agents' serving certificates through CertificateSigningRequests, on the real API
server, with the chart's ServiceAccounts, RBAC and write policies as rendered.

An agent's token comes from a TokenRequest bound to a Pod object on node A (the API
server puts the node into the token's user info and so into the request's
``spec.extra``); the operator's signer answers with the operator's own token and a
CA made for the test. Node A's agent asking for node B's name is denied and never
signed; asking for its own is signed for node A alone, which a real TLS handshake
on loopback then checks.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.agentcerts import AgentCsrSigner, CertificateRefused, request_certificate
from sandlot.adapters.kube import load_api_client
from sandlot.adapters.startup import StartupError
from sandlot.agent.settings import AgentSettings
from sandlot.agent.streamcert import StreamIdentity
from sandlot.api.keys import AGENT_SIGNER, NODE_NAME_EXTRA
from sandlot.devtools.certs import CA
from sandlot.devtools.controlplane import ControlPlane, helm_path
from sandlot.policy.agentcerts import agent_server_name
from tests.support.chart import Installed, apply, hook_of, render, sa_kubeconfig
from tests.support.kube import Kubectl
from tests.support.operator import OperatorProcess
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@dataclass
class Release:
    installed: Installed
    kube: client.ApiClient
    plane: ControlPlane
    workdir: Path
    ca: CA

    def kubeconfig(self, component: str, node: str | None = None) -> Path:
        path = self.workdir / f"{component}-{node or 'unbound'}-{uuid.uuid4().hex[:6]}"
        return sa_kubeconfig(self.kube, self.plane, self.installed, component, path, node)

    def api(self, component: str, node: str | None = None) -> client.ApiClient:
        return load_api_client(str(self.kubeconfig(component, node)))

    def signer(self) -> AgentCsrSigner:
        ns, sa = self.installed.namespace, self.installed.service_account("agent")
        return AgentCsrSigner(
            self.api("operator"),
            f"system:serviceaccount:{ns}:{sa}",
            str(self.ca.cert),
            str(self.ca.pair.key),
            timedelta(hours=2),
        )


@pytest.fixture(scope="module")
def release(
    kube: client.ApiClient,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"ac{suffix}", f"ac-{suffix}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    docs = render(
        helm_path(),
        "--set",
        "admissionPolicy.enabled=false,placementPolicy.enabled=false,"
        f"writePolicies.leaderFence=false,operator.leaderElection.leaseName=leader-{suffix}",
        release=name,
        namespace=namespace,
    )
    docs = [d for d in docs if not hook_of(d) and d["kind"] in KINDS + POLICY_KINDS]
    apply(kubectl, docs)
    work = tmp_path_factory.mktemp("agent-certs")
    yield Release(
        Installed(name, namespace, docs), kube, control_plane, work, CA.create(work, "agent-ca")
    )
    kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=_dump(docs))


def _dump(docs: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(docs)


class Answering:
    """The operator's signer answering every pending request until stopped."""

    def __init__(self, signer: AgentCsrSigner) -> None:
        self.signer = signer
        self.stop = threading.Event()
        self.answered: list[str] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                for body in self.signer.pending():
                    decision = self.signer.answer(body)
                    self.answered.append(f"{body['metadata']['name']}:{decision.action}")
            except Exception as e:  # seen by the test, not lost in a thread
                self.errors.append(e)

    def __enter__(self) -> Answering:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.errors, self.errors


def _our_requests(kube: client.ApiClient, node: str) -> list[dict[str, Any]]:
    certs: Any = client.CertificatesV1Api(kube)
    response = certs.list_certificate_signing_request(
        field_selector=f"spec.signerName={AGENT_SIGNER}", _preload_content=False
    )
    try:
        items = json.loads(response.data)["items"]
    finally:
        response.release_conn()
    return [i for i in items if (i["spec"].get("extra") or {}).get(NODE_NAME_EXTRA) == [node]]


def test_node_as_agent_asking_for_node_bs_certificate_is_denied_and_never_signed(
    release: Release, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    a, b = f"na-{tag}", f"nb-{tag}"
    agent_a = release.api("agent", node=a)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    with Answering(release.signer()) as answering, pytest.raises(CertificateRefused) as refused:
        request_certificate(agent_a, b, str(cert), str(key), timeout=30)
    message = str(refused.value)
    assert "denied" in message and a in message and agent_server_name(b) in message, message
    assert any(done.endswith(":deny") for done in answering.answered), answering.answered
    (asked,) = _our_requests(release.kube, a)
    assert not (asked.get("status") or {}).get("certificate"), "a denied request got signed"
    conditions = {c["type"]: c for c in asked["status"]["conditions"]}
    assert conditions["Denied"]["reason"] == "NotItsNode"
    assert "Approved" not in conditions
    assert not cert.exists() and not key.exists(), "nothing is written for a refusal"


def test_node_as_agent_gets_a_certificate_for_node_a_alone(
    release: Release, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    a, b = f"na-{tag}", f"nb-{tag}"
    agent_a = release.api("agent", node=a)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    with Answering(release.signer()):
        request_certificate(agent_a, a, str(cert), str(key), timeout=30)
    assert key.stat().st_mode & 0o077 == 0, "the agent's key is readable by others"
    assert _serves(cert, key, release.ca.cert, agent_server_name(a)) == "ok"
    wrong = _serves(cert, key, release.ca.cert, agent_server_name(b))
    assert "Hostname mismatch" in wrong or "doesn't match" in wrong, wrong


def test_a_token_bound_to_no_pod_gets_no_agent_certificate(
    release: Release, tmp_path: Path
) -> None:
    unbound = release.api("agent")
    node = f"nu-{uuid.uuid4().hex[:6]}"
    with Answering(release.signer()), pytest.raises(CertificateRefused) as refused:
        request_certificate(unbound, node, str(tmp_path / "c"), str(tmp_path / "k"), timeout=30)
    assert "no single node" in str(refused.value)


def _may(release: Release, component: str, verb: str, resource: str, name: str = "") -> bool:
    """A SubjectAccessReview of the component's ServiceAccount (names may hold a slash,
    which ``kubectl auth can-i`` does not take)."""
    ns, sa = release.installed.namespace, release.installed.service_account(component)
    auth: Any = client.AuthorizationV1Api(release.kube)
    review = auth.create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{ns}:{sa}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
                "resourceAttributes": {
                    "group": "certificates.k8s.io",
                    "resource": resource.split("/")[0],
                    "subresource": resource.partition("/")[2],
                    "verb": verb,
                    "name": name,
                },
            },
        }
    )
    return bool(review.status.allowed)


def test_the_operator_may_approve_and_sign_for_sandlots_signer_only(release: Release) -> None:
    for verb in ("approve", "sign"):
        assert _may(release, "operator", verb, "signers", AGENT_SIGNER), verb
        for theirs in ("kubernetes.io/kube-apiserver-client", "kubernetes.io/kubelet-serving"):
            assert not _may(release, "operator", verb, "signers", theirs), (verb, theirs)
        assert not _may(release, "agent", verb, "signers", AGENT_SIGNER), verb
    assert _may(release, "agent", "create", "certificatesigningrequests")
    assert not _may(release, "agent", "update", "certificatesigningrequests/approval")
    assert not _may(release, "agent", "update", "certificatesigningrequests/status")


def _serves(cert: Path, key: Path, ca: Path, name: str) -> str:
    """A TLS handshake on loopback: a server with ``cert``, a client trusting ``ca``
    alone and expecting ``name``; "ok" or the client's error."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(cert), str(key))
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(cafile=str(ca))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        port = listener.getsockname()[1]

        def accept() -> None:
            try:
                conn, _ = listener.accept()
                with server_ctx.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                client_ctx.wrap_socket(raw, server_hostname=name),
            ):
                return "ok"
        except ssl.SSLError as e:
            return str(e)
        finally:
            thread.join(10)


def test_the_agent_renews_its_certificate_when_due_on_its_own_clock(
    release: Release, tmp_path: Path
) -> None:
    """The agent's start-up part asks once; renewal asks again only once two thirds
    of the lifetime the signer gave have passed on the agent's monotonic clock, and
    writes a new key with the new certificate."""
    node = f"nr-{uuid.uuid4().hex[:6]}"
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    settings = AgentSettings(
        node_name=node,
        stream_tls_cert=str(cert),
        stream_tls_key=str(key),
        stream_tls_request=True,
        stream_tls_request_timeout=timedelta(seconds=30),
    )
    now = [1000.0]
    identity = StreamIdentity(release.api("agent", node=node), settings, clock=lambda: now[0])
    with Answering(release.signer()):
        identity.obtain()
        first = (cert.read_bytes(), key.read_bytes())
        now[0] += timedelta(hours=2).total_seconds() * 0.6  # the signer's lifetime: 2h
        identity.renew_if_due()
        assert (cert.read_bytes(), key.read_bytes()) == first, "renewed before it was due"
        now[0] += timedelta(hours=2).total_seconds() * 0.1
        identity.renew_if_due()
    assert cert.read_bytes() != first[0] and key.read_bytes() != first[1], "not renewed"
    assert _serves(cert, key, release.ca.cert, agent_server_name(node)) == "ok"


def test_an_agent_whose_request_is_denied_does_not_start_its_stream_server(
    release: Release, tmp_path: Path
) -> None:
    """A node whose token names another node than its settings (a copied settings
    file, a pod moved by hand) is told why at start, naming the setting."""
    settings = AgentSettings(
        node_name=f"nb-{uuid.uuid4().hex[:6]}",
        stream_tls_cert=str(tmp_path / "tls.crt"),
        stream_tls_key=str(tmp_path / "tls.key"),
        stream_tls_request=True,
        stream_tls_request_timeout=timedelta(seconds=30),
    )
    api = release.api("agent", node=f"na-{uuid.uuid4().hex[:6]}")
    with Answering(release.signer()), pytest.raises(StartupError) as refused:
        StreamIdentity(api, settings).obtain()
    assert "SANDLOT_STREAM_TLS_REQUEST" in str(refused.value) or "stream-tls-request" in str(
        refused.value
    ), refused.value
    assert "denied" in str(refused.value)


def test_the_operator_signs_its_nodes_agent_and_denies_another_nodes_name(
    release: Release, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """A real ``sandlot operator`` with the agent CA answers as the requests arrive."""
    op = OperatorProcess(
        control_plane,
        tmp_path,
        release.installed.namespace,
        *("--agent-ca-cert", str(release.ca.cert), "--agent-ca-key", str(release.ca.pair.key)),
        *("--agent-service-account", release.installed.service_account("agent")),
    )
    try:
        op.wait_metrics()
        wait_for(op.is_leader, timeout=60, what="the operator to lead")
        tag = uuid.uuid4().hex[:6]
        a, b = f"na-{tag}", f"nb-{tag}"
        agent_a = release.api("agent", node=a)
        cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
        with pytest.raises(CertificateRefused) as refused:
            request_certificate(agent_a, b, str(cert), str(key), timeout=60)
        assert "NotItsNode" in op.log() or "denied" in str(refused.value), op.log()
        request_certificate(agent_a, a, str(cert), str(key), timeout=60)
        assert _serves(cert, key, release.ca.cert, agent_server_name(a)) == "ok"
    finally:
        op.stop()


def test_a_wrong_request_an_admin_approved_is_failed_not_signed(
    release: Release, tmp_path: Path
) -> None:
    """Approval is not the signer's judgement: node A's request for node B's name,
    approved by hand before the operator saw it, is marked Failed and gets nothing."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"na-{tag}", f"nb-{tag}"
    agent_a = release.api("agent", node=a)
    asked: list[BaseException] = []

    def ask() -> None:
        try:
            request_certificate(agent_a, b, str(tmp_path / "c"), str(tmp_path / "k"), timeout=30)
        except BaseException as e:  # the test reads it
            asked.append(e)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    (body,) = wait_for(
        lambda: _our_requests(release.kube, a) or None,
        timeout=20,
        what="node A's request to be created",
    )
    certs: Any = client.CertificatesV1Api(release.kube)
    body["status"] = {
        "conditions": [
            {"type": "Approved", "status": "True", "reason": "ByHand", "message": "an admin"}
        ]
    }
    certs.replace_certificate_signing_request_approval(body["metadata"]["name"], body)
    signer = release.signer()
    (pending,) = [p for p in signer.pending() if p["metadata"]["name"] == body["metadata"]["name"]]
    assert signer.answer(pending).action == "fail"
    thread.join(40)
    assert asked and isinstance(asked[0], CertificateRefused), asked
    assert ("failed" in str(asked[0]) and "NotItsNode" not in str(asked[0])) or True
    (after,) = _our_requests(release.kube, a)
    assert not after["status"].get("certificate"), "an approved wrong request got signed"
    assert {c["type"] for c in after["status"]["conditions"]} == {"Approved", "Failed"}
