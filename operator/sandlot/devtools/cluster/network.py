"""The local cluster's network: a bridge on the host holding the API server's
address, and per node a network namespace joined to it by a veth pair.

Addresses (``c`` picks the cluster's subnets, free on this host):

- ``10.201.c.0/24`` is the nodes' link *and* the Service range, so the
  ``kubernetes`` Service's ClusterIP (the range's first address, ``10.201.c.1``)
  is the bridge's own address, where kube-apiserver listens on 443: pods reach the
  API server by the in-cluster address without a Service proxy. Nodes take
  ``10.201.c.250`` upwards, away from the ClusterIPs handed out from the bottom.
- node ``i`` gives its pods ``10.(210+i).c.0/24`` (a bridge inside its namespace,
  the host routes the range to the node).

Everything here is made by the cluster and removed with it.
"""

from __future__ import annotations

import ipaddress
import random
import subprocess
from dataclasses import dataclass

FIRST_NODE_HOST = 250


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _subnet_in_use(prefix: str) -> bool:
    return prefix in _ip("-4", "route", "show") or prefix in _ip("-4", "addr", "show")


@dataclass(frozen=True)
class ClusterNet:
    tag: str  # short and unique: names the bridge, the namespaces and the veths
    c: int

    @classmethod
    def choose(cls, tag: str) -> ClusterNet:
        """A cluster subnet number whose ranges no route or address here uses."""
        candidates = list(range(1, 255))
        random.shuffle(candidates)
        for c in candidates:
            if not any(_subnet_in_use(f"10.{o}.{c}.") for o in (201, 210, 211, 212)):
                return cls(tag, c)
        raise RuntimeError("no free 10.201.x.0/24 subnet for a local cluster")

    @property
    def bridge(self) -> str:
        return f"slb{self.tag}"

    @property
    def api_address(self) -> str:
        return f"10.201.{self.c}.1"

    @property
    def service_cidr(self) -> str:
        return f"10.201.{self.c}.0/24"

    def node_address(self, index: int) -> str:
        return f"10.201.{self.c}.{FIRST_NODE_HOST + index}"

    def pod_cidr(self, index: int) -> str:
        return f"10.{210 + index}.{self.c}.0/24"

    def pod_gateway(self, index: int) -> str:
        return str(ipaddress.ip_network(self.pod_cidr(index))[1])

    def netns(self, index: int) -> str:
        return f"sl{self.tag}n{index}"

    def create_bridge(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.api_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def create_node(self, index: int, nodes: int) -> None:
        """The node's namespace, its veth on the bridge, and routes to every node's pods."""
        ns, host_end, node_end = self.netns(index), f"slv{self.tag}{index}", "eth0"
        _ip("netns", "add", ns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", f"slp{self.tag}{index}")
        _ip("link", "set", f"slp{self.tag}{index}", "netns", ns)
        _ip("-n", ns, "link", "set", f"slp{self.tag}{index}", "name", node_end)
        _ip("link", "set", host_end, "master", self.bridge)
        _ip("link", "set", host_end, "up")
        _ip("-n", ns, "addr", "add", f"{self.node_address(index)}/24", "dev", node_end)
        _ip("-n", ns, "link", "set", node_end, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.api_address)
        for other in range(nodes):
            if other != index:
                _ip("-n", ns, "route", "add", self.pod_cidr(other), "via", self.node_address(other))
        _ip("route", "add", self.pod_cidr(index), "via", self.node_address(index))
        subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            capture_output=True,
            timeout=30,
            check=True,
        )

    def netns_inode(self, index: int) -> int:
        import os

        return os.stat(f"/run/netns/{self.netns(index)}").st_ino

    def remove(self, nodes: int) -> None:
        """Delete the namespaces (their veths go with them) and the bridge (its routes too)."""
        for index in range(nodes):
            _ip("route", "del", self.pod_cidr(index), check=False)
            _ip("netns", "del", self.netns(index), check=False)
        _ip("link", "del", self.bridge, check=False)
