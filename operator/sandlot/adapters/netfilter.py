"""Installing a sandbox's packet filter inside its network namespace, and reading the
node's own addresses: the processes ``sandlot.policy.netpolicy``'s rules need.

One ``iptables-restore`` (and one ``ip6tables-restore``) per sandbox, run in the
sandbox's namespace with ``nsenter --net``: each replaces the whole filter table
atomically, so the namespace is never half-filtered. Every run has a timeout.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess

from sandlot.policy.netpolicy import Rulesets


class FilterError(Exception):
    """The rules could not be installed (or the node's addresses read): the message
    names the command and what it printed."""


def _run(argv: list[str], stdin: bytes, timeout: float) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise FilterError(f"{' '.join(argv)} did not finish within {timeout:g}s") from None
    except OSError as exc:
        raise FilterError(f"{' '.join(argv)}: {exc}") from None


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise FilterError(f"{name} is not installed on this node: no network policy can be set")
    return found


def install(netns_path: str, rulesets: Rulesets, *, timeout: float) -> None:
    """Replace the filter tables of the namespace at ``netns_path`` (IPv4, then IPv6)."""
    nsenter = _tool("nsenter")
    for tool, text in (("iptables-restore", rulesets.ipv4), ("ip6tables-restore", rulesets.ipv6)):
        argv = [nsenter, f"--net={netns_path}", _tool(tool)]
        proc = _run(argv, text.encode(), timeout)
        if proc.returncode != 0:
            said = proc.stderr.decode(errors="replace").strip()[-2000:]
            raise FilterError(f"{tool} in {netns_path} failed ({proc.returncode}): {said}")


def node_addresses(*, timeout: float) -> list[str]:
    """Every address of this (the agent's, the node's) network namespace."""
    return sorted({i.partition("/")[0] for i in interfaces(timeout=timeout)})


def interfaces(netns_path: str = "", *, timeout: float) -> list[str]:
    """The non-loopback addresses, with their prefix lengths (``10.77.0.5/24``), of
    this network namespace or of the one at ``netns_path``."""
    argv = [_tool("ip"), "-j", "addr", "show"]
    if netns_path:
        argv = [_tool("nsenter"), f"--net={netns_path}", *argv]
    proc = _run(argv, b"", timeout)
    if proc.returncode != 0:
        raise FilterError(f"ip addr show: {proc.stderr.decode(errors='replace').strip()}")
    try:
        links = json.loads(proc.stdout or b"[]")
    except json.JSONDecodeError as exc:
        raise FilterError(f"ip -j addr show printed no JSON: {exc}") from None
    found = []
    for link in links:
        for info in link.get("addr_info") or []:
            local = str(info.get("local") or "")
            try:
                addr = ipaddress.ip_address(local)
            except ValueError:
                continue
            if not addr.is_loopback:
                found.append(f"{addr}/{info.get('prefixlen', addr.max_prefixlen)}")
    return sorted(set(found))


__all__ = ["FilterError", "install", "interfaces", "node_addresses"]
