"""A sandbox's network policy as the packet filter of its own network namespace: pure.

Sandboxes are not pods, so no NetworkPolicy engine sees them; the agent installs
what ``render_rulesets`` returns with one ``iptables-restore`` (and one
``ip6tables-restore``) inside the sandbox's namespace before its process starts.
The sandbox has no CAP_NET_ADMIN there, so it cannot change them, and they go away
with the namespace. The trade-off: rules live per sandbox (nothing on the node's own
tables to leak or to collide with kube-proxy's), so a peer that starts later is not
in a sandbox's ingress until that sandbox's rules are rendered again.

The layers, outermost first, as AdminNetworkPolicy stands above NetworkPolicy:

- the cluster default (``ClusterDefault``, the agent's settings): connections in
  only from the node's own addresses (probes, masqueraded traffic) and replies, and,
  while no ingress rules are set, to the ports the sandbox publishes to its pool's
  Service from anywhere (kube-proxy keeps a Service client's own address); out,
  everything but the blocked ranges (link-local and metadata, CGNAT, the node's
  addresses, the cluster's service and pod ranges, RFC 1918 and IPv6's unique-local
  range, the sandbox's own network). Only ``allowed_egress`` opens a blocked range;
  no tenant's rule does (a rule naming ``169.254.169.254/32`` would otherwise reach
  cloud metadata, and one naming the node its kubelet);
- the namespace default (annotation ``sandlot.dev/default-network-policy``), which
  stands in for a Sandbox's missing ``ingress`` or ``egress``;
- the Sandbox's own ``spec.networkPolicy``. Its ``egress`` only narrows: once set,
  a connection goes out only where a rule allows it *and* the cluster does.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from sandlot.api.keys import DEFAULT_NETWORK_POLICY_ANNOTATION
from sandlot.api.netpolicy import (
    IpBlock,
    LabelSelector,
    PolicyPort,
    SandboxNetworkPolicy,
    parse_cidr,
)
from sandlot.api.sandbox import SandboxPort

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
CGNAT = ("100.64.0.0/10",)
"""Shared address space (RFC 6598): some clouds serve their metadata from it."""
CLUSTER_CHAIN = "SL-CLUSTER"
"""The cluster's egress blocks, jumped to before any tenant rule is read."""
# ICMPv6 neighbour discovery (router/neighbour solicitation and advertisement): without
# it IPv6 has no neighbours, whatever the rules allow.
_NDP_TYPES = (133, 134, 135, 136)


@dataclass(frozen=True)
class ClusterDefault:
    """The node-wide floor under every sandbox's policy (from the agent's settings)."""

    blocked: tuple[str, ...] = LINK_LOCAL + CGNAT + PRIVATE
    """Destinations refused unless ``allowed_egress`` opens them (CIDRs)."""
    cluster_ranges: tuple[str, ...] = ()
    """The cluster's service and pod ranges, refused the same way."""
    allowed_egress: tuple[str, ...] = ()
    """Destinations inside the blocked ranges the cluster opens (cluster DNS): the only
    way into a blocked range. A tenant's egress rules may still narrow them away."""


@dataclass(frozen=True)
class Peer:
    """Another sandbox of the namespace: its labels and address."""

    labels: Mapping[str, str]
    ip: str


@dataclass(frozen=True)
class Rulesets:
    """What ``iptables-restore`` and ``ip6tables-restore`` read."""

    ipv4: str
    ipv6: str
    peers: tuple[str, ...] = field(default=())  # addresses of the peers let in


def parse_namespace_default(text: str, namespace: str) -> SandboxNetworkPolicy | None:
    """The namespace annotation's policy; None when it has none; ValueError naming it."""
    if not text.strip():
        return None
    where = f"namespace {namespace} annotation {DEFAULT_NETWORK_POLICY_ANNOTATION}"
    try:
        return SandboxNetworkPolicy.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON: {exc}") from None
    except ValidationError as exc:
        raise ValueError(f"{where}: {exc}") from None


def effective(
    own: SandboxNetworkPolicy | None, namespace_default: SandboxNetworkPolicy | None
) -> SandboxNetworkPolicy:
    """The Sandbox's ingress and egress, each falling back to the namespace's."""
    fallback = namespace_default or SandboxNetworkPolicy()
    own = own or SandboxNetworkPolicy()
    return SandboxNetworkPolicy(
        ingress=own.ingress if own.ingress is not None else fallback.ingress,
        egress=own.egress if own.egress is not None else fallback.egress,
    )


def selectors(policy: SandboxNetworkPolicy) -> list[LabelSelector]:
    """The sandbox selectors of its ingress: whose addresses the agent must find."""
    return [
        peer.sandbox_selector
        for rule in policy.ingress or []
        for peer in rule.from_
        if peer.sandbox_selector is not None
    ]


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label selector semantics (an empty selector matches everything)."""
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for req in selector.match_expressions:
        present = req.key in labels
        if req.operator == "In" and (not present or labels[req.key] not in req.values):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in req.values:
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


def reserved_port_refusal(ports: Sequence[SandboxPort], reserved: Iterable[int]) -> str | None:
    """Why a sandbox reported at the node's address may not publish ``ports`` (its
    pool's EndpointSlice would send the Service's traffic to the node's own service
    on that port); None when none is reserved."""
    taken = sorted({p.container_port for p in ports} & set(reserved))
    if not taken:
        return None
    names = ", ".join(str(p) for p in taken)
    return (
        f"spec.ports: {names} served by the node itself; a sandbox at the node's address "
        "(host network or host-address mode) may not publish it"
    )


def parse_cidr_list(texts: Iterable[str], where: str) -> list[Network]:
    """CIDRs of a setting, refused naming it and the bad entry."""
    return [parse_cidr(t, f"{where}[{i}]") for i, t in enumerate(texts)]


def selector_string(selector: LabelSelector) -> str:
    """The selector as the API server's ``labelSelector`` parameter."""
    terms = [f"{k}={v}" for k, v in sorted(selector.match_labels.items())]
    for req in selector.match_expressions:
        values = ",".join(req.values)
        terms.append(
            {
                "In": f"{req.key} in ({values})",
                "NotIn": f"{req.key} notin ({values})",
                "Exists": req.key,
                "DoesNotExist": f"!{req.key}",
            }[req.operator]
        )
    return ",".join(terms)


def _networks(texts: Iterable[str], version: int) -> list[Network]:
    nets = [parse_cidr(t, "blocked range") for t in texts]
    return [n for n in nets if n.version == version]


def _host(ip: str) -> Network:
    return ipaddress.ip_network(ip)


def _matching(selector: LabelSelector, peers: Sequence[Peer]) -> list[str]:
    return sorted({p.ip for p in peers if p.ip and selector_matches(selector, p.labels)})


def _port_matches(ports: Sequence[PolicyPort], version: int) -> list[str]:
    if not ports:
        return [""]
    out = []
    for port in ports:
        proto = port.protocol.lower()
        out.append(f" -p {proto}" + (f" -m {proto} --dport {port.port}" if port.port else ""))
    return out


def _block_chain(
    chain: str, block: IpBlock, version: int, direction: str, ports: list[str]
) -> list[str] | None:
    """A chain accepting ``block`` minus its exceptions; None if of the other family."""
    cidr = parse_cidr(block.cidr, "ipBlock.cidr")
    if cidr.version != version:
        return None
    lines = [f"-A {chain} {direction} {e} -j RETURN" for e in block.except_]
    lines += [f"-A {chain} {direction} {cidr}{p} -j ACCEPT" for p in ports]
    return lines


def _family(
    version: int,
    policy: SandboxNetworkPolicy,
    default: ClusterDefault,
    node_addresses: Sequence[str],
    peers: Sequence[Peer],
    published: Sequence[SandboxPort],
) -> str:
    chains: list[str] = []
    body: list[str] = []
    node = [_host(a) for a in node_addresses if _host(a).version == version]

    body += ["-A INPUT -i lo -j ACCEPT", "-A OUTPUT -o lo -j ACCEPT"]
    body += [
        f"-A {c} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT" for c in ("INPUT", "OUTPUT")
    ]
    if version == 6:
        for kind in _NDP_TYPES:
            for c in ("INPUT", "OUTPUT"):
                body.append(f"-A {c} -p ipv6-icmp -m icmp6 --icmpv6-type {kind} -j ACCEPT")
    body += [f"-A INPUT -s {n} -j ACCEPT" for n in node]
    if policy.ingress is None:  # no rules: its pool Service's clients reach what it serves
        for port in published:
            proto = port.protocol.lower()
            body.append(f"-A INPUT -p {proto} -m {proto} --dport {port.container_port} -j ACCEPT")

    for i, rule in enumerate(policy.ingress or []):
        ports = _port_matches(rule.ports, version)
        if not rule.from_:
            body += [f"-A INPUT{p} -j ACCEPT" for p in ports]
            continue
        for j, peer in enumerate(rule.from_):
            if peer.ip_block is not None:
                chain = f"SL-IN-{i}-{j}"
                lines = _block_chain(chain, peer.ip_block, version, "-s", ports)
                if lines is None:
                    continue
                chains.append(chain)
                body += [f"-A INPUT -j {chain}", *lines]
            elif peer.sandbox_selector is not None:
                for ip in _matching(peer.sandbox_selector, peers):
                    if _host(ip).version == version:
                        body += [f"-A INPUT -s {_host(ip)}{p} -j ACCEPT" for p in ports]

    # The cluster's blocks before any tenant rule: what it refuses no rule reopens.
    # Its openings return to the tenant's rules, which only narrow.
    chains.append(CLUSTER_CHAIN)
    body.append(f"-A OUTPUT -j {CLUSTER_CHAIN}")
    body += [
        f"-A {CLUSTER_CHAIN} -d {n} -j RETURN" for n in _networks(default.allowed_egress, version)
    ]
    blocked = [*_networks(default.blocked, version), *_networks(default.cluster_ranges, version)]
    body += [f"-A {CLUSTER_CHAIN} -d {n} -j REJECT" for n in [*node, *blocked]]
    if policy.egress is None:
        return _table(chains, body)  # no rules: out wherever the cluster allows
    for i, egress in enumerate(policy.egress):
        ports = _port_matches(egress.ports, version)
        if not egress.to:
            body += [f"-A OUTPUT{p} -j ACCEPT" for p in ports]
            continue
        for j, dest in enumerate(egress.to):
            chain = f"SL-OUT-{i}-{j}"
            lines = _block_chain(chain, dest.ip_block, version, "-d", ports)
            if lines is None:
                continue
            chains.append(chain)
            body += [f"-A OUTPUT -j {chain}", *lines]
    body.append("-A OUTPUT -j REJECT")  # rules set: out only where one allows
    return _table(chains, body)


def _table(chains: Sequence[str], body: Sequence[str]) -> str:
    head = ["*filter", ":INPUT DROP [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]"]
    head += [f":{c} - [0:0]" for c in chains]
    return "\n".join([*head, *body, "COMMIT", ""])


def admitted_peers(policy: SandboxNetworkPolicy, peers: Sequence[Peer]) -> tuple[str, ...]:
    """The addresses of the peers an ingress selector admits: when they change, the
    sandbox's filter is rendered again."""
    return tuple(sorted({ip for s in selectors(policy) for ip in _matching(s, peers)}))


def render_rulesets(
    policy: SandboxNetworkPolicy,
    default: ClusterDefault,
    node_addresses: Sequence[str],
    peers: Sequence[Peer] = (),
    published: Sequence[SandboxPort] = (),
) -> Rulesets:
    """The filter tables of a sandbox's namespace, for IPv4 and IPv6.

    ``node_addresses`` are the node's own (connections from them are its routing and
    probes; connections to them are refused); ``peers`` the namespace's other running
    sandboxes, of which those an ingress selector matches are let in; ``published``
    the ports it serves (``spec.ports``, its pool Service's), open to any source
    while neither it nor its namespace sets ingress rules: a Service's clients
    arrive with their own addresses, not the node's.
    """
    let_in = admitted_peers(policy, peers)
    return Rulesets(
        ipv4=_family(4, policy, default, node_addresses, peers, published),
        ipv6=_family(6, policy, default, node_addresses, peers, published),
        peers=let_in,
    )


__all__ = [
    "CGNAT",
    "CLUSTER_CHAIN",
    "LINK_LOCAL",
    "PRIVATE",
    "ClusterDefault",
    "Peer",
    "Rulesets",
    "admitted_peers",
    "effective",
    "parse_cidr_list",
    "parse_namespace_default",
    "render_rulesets",
    "reserved_port_refusal",
    "selector_matches",
    "selector_string",
    "selectors",
]
