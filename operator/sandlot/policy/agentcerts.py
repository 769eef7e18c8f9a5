"""Who an agent's certificate names, and which requests for one are signed. Pure.

Every agent has its own serving certificate naming its node, issued by sandlot's
agent CA, whose key only the operator holds; the gateway dials a sandbox's agent
by the name of the sandbox's node, so a certificate of another node fails the
handshake. An agent asks for its certificate in a ``certificates.k8s.io/v1``
CertificateSigningRequest with sandlot's signer name; the API server records who
asked (``spec.username``, ``spec.extra``), and a token bound to a Pod carries that
Pod's node. The operator signs only when the requester is the agent's
ServiceAccount, bound to a Pod, and asks for exactly its own node's name: a node
cannot obtain another node's certificate, whatever its request says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sandlot.api.keys import AGENT_SIGNER, NODE_NAME_EXTRA, POD_NAME_EXTRA

AGENT_COMMON_NAME = "sandlot-agent"
AGENT_NAME_SUFFIX = ".agent.sandlot.internal"  # never a public name, never an IP address
MAX_DNS_NAME = 253

SERVER_USAGES = frozenset({"digital signature", "key encipherment", "server auth"})
# Keys strong enough for a serving certificate: EC on these curves, RSA this long.
EC_CURVES = frozenset({"secp256r1", "secp384r1"})
MIN_RSA_BITS = 2048


def agent_server_name(node: str) -> str:
    """The DNS name the agent of ``node`` is certified for, and the name the gateway
    verifies when it dials that node's agent."""
    return f"{node}{AGENT_NAME_SUFFIX}"


def certified_node(dns_names: Sequence[str]) -> str:
    """The one node a certificate with these DNS names is an agent's for; empty when it
    names none, several, or a pattern (the operator issues exactly one name)."""
    nodes = {
        name.removesuffix(AGENT_NAME_SUFFIX)
        for name in dns_names
        if name.endswith(AGENT_NAME_SUFFIX)
    }
    if len(nodes) != 1 or len(dns_names) != 1:
        return ""
    (node,) = nodes
    return "" if not node or "*" in node else node


@dataclass(frozen=True)
class AgentCsr:
    """A CertificateSigningRequest as the operator reads it: what the API server
    recorded about the requester, and what the request's PEM asks for."""

    name: str
    signer_name: str
    username: str
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)
    usages: tuple[str, ...] = ()
    common_name: str = ""
    dns_names: tuple[str, ...] = ()
    other_names: tuple[str, ...] = ()  # IP addresses, e-mails, URIs: an agent asks for none
    key: str = ""  # "ec:<curve>" or "rsa:<bits>"; anything else is refused
    signature_valid: bool = False  # the request is signed by the key it names
    approved: bool = False
    denied: bool = False
    failed: bool = False
    issued: bool = False  # status.certificate is set


@dataclass(frozen=True)
class CsrDecision:
    """``sign``: approve (unless approved already) and issue for ``node``; ``deny``:
    set the Denied condition; ``fail``: approved by someone else, yet not the
    request of that node's agent: the signer refuses it (Failed); ``skip``: not ours,
    or already answered."""

    action: Literal["sign", "deny", "fail", "skip"]
    reason: str
    message: str
    node: str = ""


def _key_is_strong(key: str) -> bool:
    kind, _, size = key.partition(":")
    if kind == "ec":
        return size in EC_CURVES
    if kind == "rsa":
        return size.isdigit() and int(size) >= MIN_RSA_BITS
    return False


def decide_agent_csr(csr: AgentCsr, *, agent_user: str) -> CsrDecision:
    """Whether ``csr`` is the request of one node's agent for that node's own
    certificate; ``agent_user`` is the agents' ServiceAccount user name
    (``system:serviceaccount:<namespace>:<name>``)."""
    if csr.signer_name != AGENT_SIGNER:
        return CsrDecision("skip", "NotOurs", f"signer {csr.signer_name!r} is not sandlot's")
    if csr.issued or csr.denied or csr.failed:
        return CsrDecision("skip", "Answered", f"{csr.name} is answered already")
    refused: Literal["deny", "fail"] = "fail" if csr.approved else "deny"
    if csr.username != agent_user:
        return CsrDecision(
            refused,
            "NotTheAgent",
            f"only {agent_user} may ask for an agent certificate; {csr.username!r} asked",
        )
    nodes = [n for n in csr.extra.get(NODE_NAME_EXTRA, ()) if n]
    pods = [p for p in csr.extra.get(POD_NAME_EXTRA, ()) if p]
    if len(nodes) != 1 or len(pods) != 1:
        return CsrDecision(
            refused,
            "NotBoundToANode",
            f"the requester's token names no single node ({NODE_NAME_EXTRA}: {nodes}) "
            f"or pod ({POD_NAME_EXTRA}: {pods}): only a token bound to an agent pod may ask",
        )
    node = nodes[0]
    wanted = agent_server_name(node)
    if len(wanted) > MAX_DNS_NAME:
        return CsrDecision(
            refused, "NodeNameTooLong", f"{wanted!r} is longer than {MAX_DNS_NAME} characters"
        )
    if csr.dns_names != (wanted,) or csr.other_names:
        asked = list(csr.dns_names) + list(csr.other_names)
        return CsrDecision(
            refused,
            "NotItsNode",
            f"node {node}'s agent may ask only for {wanted!r}; it asked for {asked}",
            node,
        )
    if csr.common_name != AGENT_COMMON_NAME:
        return CsrDecision(
            refused,
            "WrongCommonName",
            f"the common name must be {AGENT_COMMON_NAME!r}, not {csr.common_name!r}",
            node,
        )
    usages = set(csr.usages)
    if "server auth" not in usages or not usages <= SERVER_USAGES:
        return CsrDecision(
            refused,
            "WrongUsages",
            f"an agent's certificate serves: usages {sorted(SERVER_USAGES)} with "
            f"'server auth'; asked {sorted(usages)}",
            node,
        )
    if not _key_is_strong(csr.key) or not csr.signature_valid:
        return CsrDecision(
            refused,
            "BadKey",
            f"the request's key ({csr.key or 'unknown'}) is not an EC P-256/P-384 or RSA "
            f">= {MIN_RSA_BITS} key that signed the request",
            node,
        )
    return CsrDecision("sign", "AgentOfItsNode", f"node {node}'s agent, for {wanted}", node)


RENEW_AT = 2 / 3  # of a certificate's lifetime, as the kubelet's certificate manager (70-90%)


def renew_after(not_before: float, not_after: float) -> float:
    """Seconds after a certificate arrived at which its agent asks for the next: a
    share of its lifetime, the difference of two times the signer wrote. The agent
    counts them on its own monotonic clock from the moment it received the
    certificate, never comparing the signer's clock with its own."""
    return max(0.0, (not_after - not_before) * RENEW_AT)


__all__ = [
    "AGENT_COMMON_NAME",
    "AGENT_NAME_SUFFIX",
    "AgentCsr",
    "CsrDecision",
    "agent_server_name",
    "certified_node",
    "decide_agent_csr",
    "renew_after",
]
