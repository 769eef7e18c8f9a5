"""Agents' serving certificates through ``certificates.k8s.io/v1``: the agent asks,
the operator answers (``policy.agentcerts`` decides).

The agent makes its key in memory, sends only a request signed with it, and writes
key and certificate to its own files once the certificate is issued: the key never
leaves the node. The operator reads what the API server recorded about the
requester, approves or denies, and signs with the agent CA (files only it mounts),
writing the subject and name from the node the requester's token is bound to,
never from the request.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api.keys import AGENT_SIGNER
from sandlot.policy.agentcerts import (
    AGENT_COMMON_NAME,
    AgentCsr,
    CsrDecision,
    agent_server_name,
    decide_agent_csr,
)

log = logging.getLogger(__name__)

BACKDATE = datetime.timedelta(minutes=5)  # as Kubernetes' own signers: some clock skew
USAGES = ["digital signature", "server auth"]
POLL = 0.5  # seconds between reads of a request not answered yet


class CertificateRefused(RuntimeError):
    """The request was denied or failed; the message says why."""


def _json(response: Any) -> dict[str, Any]:
    """The body of a response read unparsed (``_preload_content=False``): read whole
    before its connection goes back to the pool, which a half-read one would break."""
    try:
        return dict(json.loads(response.data))
    finally:
        response.release_conn()


# --- the request, read ---------------------------------------------------------------


def _conditions(status: Mapping[str, Any]) -> dict[str, str]:
    return {
        c.get("type", ""): c.get("message", "") or c.get("reason", "")
        for c in status.get("conditions") or ()
        if c.get("status", "True") == "True"
    }


def _key_of(public: Any) -> str:
    if isinstance(public, ec.EllipticCurvePublicKey):
        return f"ec:{public.curve.name}"
    if isinstance(public, rsa.RSAPublicKey):
        return f"rsa:{public.key_size}"
    return type(public).__name__


def csr_facts(body: Mapping[str, Any]) -> AgentCsr:
    """What a CertificateSigningRequest (the API server's JSON) asks and who asked."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    conditions = _conditions(status)
    facts = AgentCsr(
        name=(body.get("metadata") or {}).get("name", ""),
        signer_name=spec.get("signerName", ""),
        username=spec.get("username", ""),
        extra={k: list(v or ()) for k, v in (spec.get("extra") or {}).items()},
        usages=tuple(spec.get("usages") or ()),
        approved="Approved" in conditions,
        denied="Denied" in conditions,
        failed="Failed" in conditions,
        issued=bool(status.get("certificate")),
    )
    try:
        request = x509.load_pem_x509_csr(base64.b64decode(spec.get("request", "")))
    except ValueError:
        return facts  # nothing it asks can be read: refused as a bad key
    names = [a.value for a in request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    dns: list[str] = []
    other: list[str] = []
    try:
        san = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = [str(n) for n in san.get_values_for_type(x509.DNSName)]
        other = [str(n.value) for n in san if not isinstance(n, x509.DNSName)]
    except x509.ExtensionNotFound:
        pass
    return AgentCsr(
        **{
            **facts.__dict__,
            "common_name": str(names[0]) if len(names) == 1 else "",
            "dns_names": tuple(dns),
            "other_names": tuple(other),
            "key": _key_of(request.public_key()),
            "signature_valid": request.is_signature_valid,
        }
    )


# --- the operator's side ----------------------------------------------------------------


def issue(
    request_pem: bytes,
    node: str,
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    *,
    now: datetime.datetime,
    lifetime: datetime.timedelta,
) -> bytes:
    """A serving certificate for ``node``'s agent on the key of ``request_pem``,
    signed by the agent CA. Subject and name come from ``node``, not the request."""
    request = x509.load_pem_x509_csr(request_pem)
    ca = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key: Any = serialization.load_pem_private_key(ca_key_pem, password=None)
    try:
        ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:  # a CA made without one: the same hash, computed
        ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca.public_key())  # type: ignore[arg-type]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, AGENT_COMMON_NAME)]))
        .issuer_name(ca.subject)
        .public_key(request.public_key())
        .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + lifetime, ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=True,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(agent_server_name(node))]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(request.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class AgentCsrSigner:
    """Answers agents' CertificateSigningRequests: ``answer(body)`` for each one seen.
    The CA files are read at every signing, so a rotated CA signs from then on."""

    api: client.ApiClient
    agent_user: str
    ca_cert: str
    ca_key: str
    lifetime: datetime.timedelta
    clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)

    def pending(self) -> list[dict[str, Any]]:
        """Every request of sandlot's signer not answered yet."""
        certs: Any = client.CertificatesV1Api(self.api)
        response = certs.list_certificate_signing_request(
            field_selector=f"spec.signerName={AGENT_SIGNER}", _preload_content=False
        )
        try:
            items = json.loads(response.data).get("items") or []
        finally:
            response.release_conn()
        return [
            item
            for item in items
            if not (item.get("status") or {}).get("certificate")
            and not {"Denied", "Failed"} & set(_conditions(item.get("status") or {}))
        ]

    def answer(self, body: Mapping[str, Any]) -> CsrDecision:
        decision = decide_agent_csr(csr_facts(body), agent_user=self.agent_user)
        name = body["metadata"]["name"]
        if decision.action == "skip":
            return decision
        log.info("agent certificate request %s: %s (%s)", name, decision.action, decision.message)
        certs: Any = client.CertificatesV1Api(self.api)
        current = dict(body)
        if decision.action == "deny":
            self._condition(certs.replace_certificate_signing_request_approval, current,
                            "Denied", decision)  # fmt: skip
            return decision
        if decision.action == "fail":
            self._condition(certs.replace_certificate_signing_request_status, current,
                            "Failed", decision)  # fmt: skip
            return decision
        if not csr_facts(current).approved:
            current = self._condition(
                certs.replace_certificate_signing_request_approval, current, "Approved", decision
            )
        with open(self.ca_cert, "rb") as f:
            ca_cert = f.read()
        with open(self.ca_key, "rb") as f:
            ca_key = f.read()
        pem = issue(
            base64.b64decode(current["spec"]["request"]),
            decision.node,
            ca_cert,
            ca_key,
            now=self.clock(),
            lifetime=self.lifetime,
        )
        status = dict(current.get("status") or {})
        status["certificate"] = base64.b64encode(pem).decode()
        body_out = {**current, "status": status}
        _json(certs.replace_certificate_signing_request_status(
            name, body_out, _preload_content=False
        ))  # fmt: skip
        return decision

    def _condition(
        self,
        call: Callable[..., Any],
        body: Mapping[str, Any],
        type_: str,
        decision: CsrDecision,
    ) -> dict[str, Any]:
        status = dict(body.get("status") or {})
        stamp = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        status["conditions"] = [
            *(status.get("conditions") or ()),
            {
                "type": type_,
                "status": "True",
                "reason": decision.reason,
                "message": decision.message,
                "lastUpdateTime": stamp,
                "lastTransitionTime": stamp,
            },
        ]
        response = call(body["metadata"]["name"], {**body, "status": status},
                        _preload_content=False)  # fmt: skip
        try:
            return dict(json.loads(response.data))
        finally:
            response.release_conn()


# --- the agent's side ------------------------------------------------------------------


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def request_certificate(
    api: client.ApiClient,
    node: str,
    cert_path: str,
    key_path: str,
    *,
    timeout: float,
) -> x509.Certificate:
    """Ask for ``node``'s agent certificate on a new key and wait for it at most
    ``timeout`` seconds; write key and certificate to their files when issued.
    ``CertificateRefused`` when denied or failed, ``TimeoutError`` when unanswered."""
    key = ec.generate_private_key(ec.SECP256R1())
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, AGENT_COMMON_NAME)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(agent_server_name(node))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": f"sandlot-agent-{node[:200]}-"},
        "spec": {
            "request": base64.b64encode(request.public_bytes(serialization.Encoding.PEM)).decode(),
            "signerName": AGENT_SIGNER,
            "usages": USAGES,
        },
    }
    certs: Any = client.CertificatesV1Api(api)
    created = certs.create_certificate_signing_request(body, _preload_content=False)
    name = json.loads(created.data)["metadata"]["name"]
    created.release_conn()
    pem = _wait_issued(certs, name, timeout)
    cert = x509.load_pem_x509_certificate(pem)
    _write(key_path, key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ), 0o600)  # fmt: skip
    _write(cert_path, pem, 0o644)
    log.info("agent certificate %s issued for %s, valid until %s", name, node,
             cert.not_valid_after_utc.isoformat())  # fmt: skip
    return cert


def _wait_issued(certs: Any, name: str, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = certs.read_certificate_signing_request(name, _preload_content=False)
            body = json.loads(response.data)
            response.release_conn()
        except ApiException as e:
            raise CertificateRefused(f"certificate request {name}: {e.status} {e.reason}") from None
        status = body.get("status") or {}
        conditions = _conditions(status)
        for refused in ("Denied", "Failed"):
            if refused in conditions:
                raise CertificateRefused(
                    f"certificate request {name} {refused.lower()}: {conditions[refused]}"
                )
        if status.get("certificate"):
            return base64.b64decode(status["certificate"])
        time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
    raise TimeoutError(
        f"certificate request {name} ({AGENT_SIGNER}) not answered within {timeout:g}s: "
        "is sandlot's operator running with its agent CA?"
    )


__all__ = [
    "AgentCsrSigner",
    "CertificateRefused",
    "csr_facts",
    "issue",
    "request_certificate",
]
