"""The agent's settings for sandboxes' networking: how a sandbox gets its address,
and the cluster's default network policy. Part of ``AgentSettings``, whose flags
and environment variables they keep (``--cni-conf-dir``, ``SANDLOT_CNI_CONF_DIR``)."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from pydantic import Field

from sandlot.api.settings import PositiveDuration, SettingsModel
from sandlot.policy.netpolicy import CGNAT, LINK_LOCAL, PRIVATE

# ssh, etcd, the API server, kubelet (and its read-only port), kube-proxy, the
# controller manager and the scheduler.
RESERVED_PORTS = (22, 2379, 2380, 6443, 10250, 10255, 10256, 10257, 10259)


class NetworkMode(StrEnum):
    """How a sandbox without ``hostNetwork`` gets its address."""

    AUTO = "auto"
    """``cni`` when the CNI configuration directory holds a configuration at start-up,
    else ``host-address`` (a node without a pod network, a laptop)."""
    CNI = "cni"
    """Own network namespace set up by the node's CNI plugins; its IP is the
    sandbox's. A sandbox that cannot be attached ends Failed (NetworkSetupFailed)."""
    HOST_ADDRESS = "host-address"
    """Own network namespace with only a loopback; the node's address is reported."""


class NetworkSettings(SettingsModel):
    network_mode: NetworkMode = Field(
        default=NetworkMode.AUTO,
        description="Sandbox networking: cni (the node's CNI plugins give each sandbox "
        "its own address), host-address (loopback only, the node's address is "
        "reported), or auto (cni when cni_conf_dir holds a configuration at start).",
    )
    cni_conf_dir: str = Field(
        default="/etc/cni/net.d",
        min_length=1,
        description="CNI configuration directory (the kubelet's): its lexically first "
        "*.conflist, *.conf or *.json file is the sandboxes' network.",
    )
    cni_bin_dir: str = Field(
        default="/opt/cni/bin",
        min_length=1,
        description="CNI plugin directories, colon-separated (e.g. /opt/cni/bin:/usr/lib/cni).",
    )
    cni_timeout: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="Deadline of one CNI operation (the whole ADD or DEL chain), and of "
        "each network namespace command.",
    )
    network_policy_disabled: bool = Field(
        default=False,
        description="Install no packet filter in the sandboxes' network namespaces (their "
        "spec.networkPolicy and the defaults below are then not enforced).",
    )
    network_policy_resync: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="How often the filters of running sandboxes whose ingress selects "
        "peers by labels are rendered again with the peers' current addresses.",
    )
    blocked_egress: list[str] = Field(
        default_factory=lambda: list(LINK_LOCAL + CGNAT + PRIVATE),
        description="CIDRs no sandbox reaches unless allowed_egress opens them; no "
        "sandbox's own egress rule does (repeatable; default: link-local and "
        "100.64.0.0/10, which hold clouds' metadata, RFC 1918 and fc00::/7). The node's "
        "own addresses and the sandbox's own network are refused too.",
    )
    cluster_cidrs: list[str] = Field(
        default_factory=list,
        description="The cluster's service and pod ranges (repeatable), refused like "
        "blocked_egress.",
    )
    allowed_egress: list[str] = Field(
        default_factory=list,
        description="CIDRs inside the refused ranges that sandboxes may reach "
        "(repeatable), such as the cluster DNS service's address: the only opening into "
        "them. A sandbox's own egress rules may still narrow it away.",
    )
    reserved_ports: list[int] = Field(
        default_factory=lambda: list(RESERVED_PORTS),
        description="Ports the node serves itself (repeatable; the agent's own metrics "
        "and stream ports are added): a sandbox reported at the node's address "
        "(hostNetwork, host-address mode) may not publish them.",
    )
