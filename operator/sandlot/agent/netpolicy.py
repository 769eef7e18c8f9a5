"""A sandbox's network policy, from its spec and its namespace's default to the
filter in its network namespace, between the CNI ADD and the task's start: the
sandbox never runs without it. Decisions are ``sandlot.policy.netpolicy``'s; this
module reads what they need (the namespace's annotation, the node's addresses, the
peers' addresses) and installs the result.

Peers an ingress selector names are those Running with an address when the sandbox
starts; every ``network_policy_resync`` the filters of running sandboxes whose
admitted peers changed since are rendered and installed again (one that starts
later waits that long to be let in).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sandlot.adapters import netfilter
from sandlot.adapters.cni import Netns
from sandlot.adapters.nodeguard import namespace_annotations
from sandlot.adapters.objects import Objects
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.rules import StartFailed
from sandlot.agent.settings import AgentSettings
from sandlot.api.common import key_of
from sandlot.api.keys import DEFAULT_NETWORK_POLICY_ANNOTATION
from sandlot.api.netpolicy import SandboxNetworkPolicy
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase, SandboxPort, SandboxSpec
from sandlot.policy.netpolicy import (
    Peer,
    admitted_peers,
    effective,
    parse_namespace_default,
    render_rulesets,
    reserved_port_refusal,
    selector_string,
    selectors,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedPolicy:
    policy: SandboxNetworkPolicy
    peers: tuple[Peer, ...]
    published: tuple[SandboxPort, ...] = ()


@dataclass(frozen=True)
class _Installed:
    policy: SandboxNetworkPolicy
    admitted: tuple[str, ...] | None  # None: not installed by this agent (re-adopted)
    published: tuple[SandboxPort, ...] = ()


class NetworkPolicies:
    """Network policies of this node's sandboxes: planned before a start, installed
    between the CNI ADD and the task's start, rendered again by ``refresh_once``
    when the peers an ingress selector admits change."""

    def __init__(
        self,
        settings: AgentSettings,
        objects: Objects,
        metrics: AgentMetrics | None = None,
        sandboxes: Callable[[], list[dict[str, Any]]] = list,
    ) -> None:
        self.settings = settings
        self.objects = objects
        self.metrics = metrics
        self.enabled = not settings.network_policy_disabled
        self.timeout = settings.cni_timeout.total_seconds()
        self._sandboxes = sandboxes
        # Container id -> its policy, and the peers its installed filter admits.
        self._installed: dict[str, _Installed] = {}

    def check_node_ports(self, spec: SandboxSpec) -> None:
        """A sandbox reported at the node's address publishing a port the node serves
        is refused: its pool's EndpointSlice would point the Service at the node's own."""
        refusal = reserved_port_refusal(spec.ports, self.settings.node_ports)
        if refusal:
            raise StartFailed(SandboxReason.RESERVED_HOST_PORT, refusal)

    def prepare(self, sb: Mapping[str, Any], spec: SandboxSpec) -> PlannedPolicy | None:
        """The sandbox's policy over its namespace's default, and the peers its
        ingress selectors let in; None when the namespace or the peers cannot be read
        now (the next sync asks again)."""
        policy = self._policy(sb, spec)
        if policy is None:
            return None
        try:
            peers = self._peers(sb, policy)
        except Exception as exc:
            log.warning("sandbox %s: cannot list its peers: %s", key_of(sb), exc)
            return None
        return PlannedPolicy(policy, tuple(peers), tuple(spec.ports))

    def _policy(self, sb: Mapping[str, Any], spec: SandboxSpec) -> SandboxNetworkPolicy | None:
        ns = sb["metadata"]["namespace"]
        try:
            text = namespace_annotations(self.objects.api, ns).get(
                DEFAULT_NETWORK_POLICY_ANNOTATION, ""
            )
        except Exception as exc:
            log.warning("sandbox %s: cannot read namespace %s: %s", key_of(sb), ns, exc)
            return None
        try:
            default = parse_namespace_default(text, ns)
        except ValueError as exc:
            raise StartFailed(SandboxReason.INVALID_NETWORK_POLICY, str(exc)) from None
        return effective(spec.network_policy, default)

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
        self,
        key: str,
        container_id: str,
        planned: PlannedPolicy,
        netns_path: str,
        own_addresses: Sequence[str],
        *,
        trigger: str = "start",
    ) -> None:
        """Render and install the sandbox's filter; StartFailed when it cannot be.
        ``own_addresses`` (with prefix lengths) give the sandbox's own network."""
        own = tuple(str(ipaddress.ip_interface(a).network) for a in own_addresses)
        default = self.settings.network_default
        default = dataclasses.replace(default, cluster_ranges=default.cluster_ranges + own)
        try:
            addresses = netfilter.node_addresses(timeout=self.timeout)
            rulesets = render_rulesets(
                planned.policy, default, addresses, planned.peers, planned.published
            )
            netfilter.install(netns_path, rulesets, timeout=self.timeout)
        except netfilter.FilterError as exc:
            raise StartFailed(SandboxReason.NETWORK_POLICY_FAILED, str(exc)) from None
        self._installed[container_id] = _Installed(
            planned.policy, rulesets.peers, planned.published
        )
        if self.metrics is not None:
            self.metrics.network_policy_installs.labels(trigger).inc()
        log.info(
            "sandbox %s: network policy installed (%s; %d peers let in)",
            key,
            trigger,
            len(rulesets.peers),
        )

    def refresh_once(self) -> None:
        """Render again the filters of this node's Running sandboxes whose admitted
        peers changed (a selected sandbox started, moved or ended). A sandbox's
        policy is the one it started with (its namespace is read once, for a
        sandbox this agent re-adopted); only selectors cost a request per pass."""
        live = set()
        for sb in self._sandboxes():
            status = sb.get("status") or {}
            cid = str(status.get("containerId") or "")
            path = Netns.path_of(Netns.name_for(cid)) if cid else ""
            if status.get("phase") != SandboxPhase.RUNNING or not path or not os.path.exists(path):
                continue
            live.add(cid)
            try:
                self._refresh(sb, cid, path)
            except (ValidationError, StartFailed, netfilter.FilterError) as exc:
                log.warning("sandbox %s: network policy not rendered again: %s", key_of(sb), exc)
        for gone in set(self._installed) - live:
            self._installed.pop(gone, None)

    def _refresh(self, sb: Mapping[str, Any], cid: str, path: str) -> None:
        known = self._installed.get(cid)
        if known is None:
            spec = SandboxSpec.model_validate(sb.get("spec") or {})
            policy = None if spec.host_network else self._policy(sb, spec)
            if policy is None:
                return
            known = self._installed[cid] = _Installed(policy, None, tuple(spec.ports))
        if not selectors(known.policy):
            return
        try:
            peers = tuple(self._peers(sb, known.policy))
        except Exception as exc:
            log.warning("sandbox %s: cannot list its peers: %s", key_of(sb), exc)
            return
        if admitted_peers(known.policy, peers) == known.admitted:
            return
        own = netfilter.interfaces(path, timeout=self.timeout)
        planned = PlannedPolicy(known.policy, peers, known.published)
        self.install(key_of(sb), cid, planned, path, own, trigger="peers")


__all__ = ["NetworkPolicies", "PlannedPolicy"]
