"""A sandbox's network policy, from its spec and its namespace's default to the
filter in its network namespace, between the CNI ADD and the task's start: the
sandbox never runs without it. Decisions are ``sandlot.policy.netpolicy``'s; this
module reads what they need (the namespace's annotation, the node's addresses, the
peers' addresses) and installs the result.

Peers an ingress selector names are those Running with an address when the sandbox
starts; one that starts later is not let in (its traffic is refused until the
sandbox is started again).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandlot.adapters import netfilter
from sandlot.adapters.cni import IpConfig
from sandlot.adapters.nodeguard import namespace_annotations
from sandlot.adapters.objects import Objects
from sandlot.agent.rules import StartFailed
from sandlot.agent.settings import AgentSettings
from sandlot.agent.status import sandbox_key
from sandlot.api.keys import DEFAULT_NETWORK_POLICY_ANNOTATION
from sandlot.api.netpolicy import SandboxNetworkPolicy
from sandlot.api.sandbox import SandboxPhase, SandboxSpec
from sandlot.policy.netpolicy import (
    REASON_POLICY_FAILED,
    REASON_RESERVED_PORT,
    Peer,
    effective,
    parse_namespace_default,
    render_rulesets,
    reserved_port_refusal,
    selector_string,
    selectors,
)

log = logging.getLogger(__name__)

REASON_INVALID_NETWORK_POLICY = "InvalidNetworkPolicy"


@dataclass(frozen=True)
class PlannedPolicy:
    policy: SandboxNetworkPolicy
    peers: tuple[Peer, ...]


class NetworkPolicies:
    def __init__(self, settings: AgentSettings, objects: Objects) -> None:
        self.settings = settings
        self.objects = objects
        self.enabled = not settings.network_policy_disabled
        self.timeout = settings.cni_timeout.total_seconds()

    def check_node_ports(self, spec: SandboxSpec) -> None:
        """A sandbox reported at the node's address publishing a port the node serves
        is refused: its pool's EndpointSlice would point the Service at the node's own."""
        refusal = reserved_port_refusal(spec.ports, self.settings.node_ports)
        if refusal:
            raise StartFailed(REASON_RESERVED_PORT, refusal)

    def prepare(self, sb: Mapping[str, Any], spec: SandboxSpec) -> PlannedPolicy | None:
        """The sandbox's policy over its namespace's default, and the peers its
        ingress selectors let in; None when the namespace or the peers cannot be read
        now (the next sync asks again)."""
        ns = sb["metadata"]["namespace"]
        try:
            text = namespace_annotations(self.objects.api, ns).get(
                DEFAULT_NETWORK_POLICY_ANNOTATION, ""
            )
        except Exception as exc:
            log.warning("sandbox %s: cannot read namespace %s: %s", sandbox_key(sb), ns, exc)
            return None
        try:
            default = parse_namespace_default(text, ns)
        except ValueError as exc:
            raise StartFailed(REASON_INVALID_NETWORK_POLICY, str(exc)) from None
        policy = effective(spec.network_policy, default)
        try:
            peers = self._peers(sb, policy)
        except Exception as exc:
            log.warning("sandbox %s: cannot list its peers: %s", sandbox_key(sb), exc)
            return None
        return PlannedPolicy(policy, tuple(peers))

    def _peers(self, sb: Mapping[str, Any], policy: SandboxNetworkPolicy) -> list[Peer]:
        ns, uid = sb["metadata"]["namespace"], sb["metadata"]["uid"]
        peers = []
        for selector in selectors(policy):
            for other in self.objects.list_sandboxes(ns, selector_string(selector)):
                status = other.get("status") or {}
                if other["metadata"]["uid"] == uid or status.get("phase") != SandboxPhase.RUNNING:
                    continue
                if status.get("ip"):
                    labels = other["metadata"].get("labels") or {}
                    peers.append(Peer(labels, str(status["ip"])))
        return peers

    def install(
        self, key: str, planned: PlannedPolicy, netns_path: str, ips: Sequence[IpConfig]
    ) -> None:
        """Render and install the sandbox's filter; StartFailed when it cannot be."""
        own = tuple(str(ipaddress.ip_interface(ip.address).network) for ip in ips)
        default = self.settings.network_default
        default = dataclasses.replace(default, cluster_ranges=default.cluster_ranges + own)
        try:
            addresses = netfilter.node_addresses(timeout=self.timeout)
            rulesets = render_rulesets(planned.policy, default, addresses, planned.peers)
            netfilter.install(netns_path, rulesets, timeout=self.timeout)
        except netfilter.FilterError as exc:
            raise StartFailed(REASON_POLICY_FAILED, str(exc)) from None
        log.info(
            "sandbox %s: network policy installed (%d peers let in)",
            key,
            len(rulesets.peers),
        )


__all__ = ["REASON_INVALID_NETWORK_POLICY", "NetworkPolicies", "PlannedPolicy"]
