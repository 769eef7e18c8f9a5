"""Running a configuration's plugin chain with the protocol's environment
(``CNI_COMMAND``, ``CNI_CONTAINERID``, ``CNI_NETNS``, ``CNI_IFNAME``, ``CNI_PATH``,
``CNI_ARGS``) and stdin (the plugin's config with the list's ``name`` and
``cniVersion``, and ``prevResult`` chained from plugin to plugin), and reading what
the plugins answer (1.0.0, and the 0.3.x/0.4.0 and 0.1/0.2 result formats).

One operation (ADD or DEL of a whole chain) has one time budget; every plugin run
gets what is left of it as its subprocess timeout. DEL runs every plugin in reverse
even after a failure, so the IPAM plugin still releases the address."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandlot.adapters.cni.config import NetworkConfigList
from sandlot.adapters.cni.errors import CniError, CniTimeout, parse_error
from sandlot.adapters.deadline import Deadline

log = logging.getLogger(__name__)

DEFAULT_IFNAME = "eth0"


def plugin_stdin(
    config: NetworkConfigList, plugin: Mapping[str, Any], prev_result: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What one plugin of the chain reads on stdin (spec: "Network configuration list
    runtime"): its own config plus the list's name and version, and the previous
    plugin's result."""
    body = copy.deepcopy(dict(plugin))
    body["name"] = config.name
    body["cniVersion"] = config.cni_version
    if prev_result is not None:
        body["prevResult"] = copy.deepcopy(dict(prev_result))
    return body


@dataclass(frozen=True)
class IpConfig:
    address: str  # CIDR, "10.77.0.2/24"
    gateway: str = ""
    interface: int | None = None

    @property
    def ip(self) -> str:
        return self.address.partition("/")[0]

    @property
    def version(self) -> int:
        return 6 if ":" in self.address else 4


@dataclass(frozen=True)
class CniResult:
    cni_version: str
    ips: tuple[IpConfig, ...] = ()
    interfaces: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    def primary_ip(self, ifname: str = DEFAULT_IFNAME) -> str | None:
        """The address to publish: the first IPv4 on the container's ``ifname``, else
        the first IPv4, else the first address at all."""
        on_ifname = [
            ip
            for ip in self.ips
            if ip.interface is not None
            and 0 <= ip.interface < len(self.interfaces)
            and self.interfaces[ip.interface].get("name") == ifname
        ]
        for group in (on_ifname, list(self.ips)):
            for ip in group:
                if ip.version == 4:
                    return ip.ip
        return self.ips[0].ip if self.ips else None


def parse_result(data: Mapping[str, Any]) -> CniResult:
    """A plugin's success output: 0.3.0-1.0.0 ``ips``/``interfaces``, or 0.1/0.2's
    ``ip4``/``ip6``."""
    version = str(data.get("cniVersion") or "")
    ips: list[IpConfig] = []
    interfaces = tuple(i for i in data.get("interfaces") or [] if isinstance(i, Mapping))
    if "ips" in data:
        for entry in data.get("ips") or []:
            if not isinstance(entry, Mapping) or not entry.get("address"):
                continue
            iface = entry.get("interface")
            ips.append(
                IpConfig(
                    address=str(entry["address"]),
                    gateway=str(entry.get("gateway") or ""),
                    interface=iface if isinstance(iface, int) else None,
                )
            )
    else:
        for key in ("ip4", "ip6"):
            legacy = data.get(key)
            if isinstance(legacy, Mapping) and legacy.get("ip"):
                ips.append(IpConfig(str(legacy["ip"]), str(legacy.get("gateway") or "")))
    return CniResult(version, tuple(ips), interfaces, dict(data))


def cni_args(pairs: Mapping[str, str]) -> str:
    """``CNI_ARGS``: ``IgnoreUnknown=1`` first, so plugins that know none of the keys
    (the Kubernetes ones the kubelet also passes) accept them."""
    return ";".join(["IgnoreUnknown=1", *(f"{k}={v}" for k, v in pairs.items())])


def split_path_list(dirs: str | Sequence[str]) -> tuple[str, ...]:
    parts = dirs.split(":") if isinstance(dirs, str) else list(dirs)
    return tuple(p for p in parts if p)


class CniRunner:
    """Runs the plugin chain of one network configuration list (per the spec's
    "Network configuration list runtime" section)."""

    def __init__(self, bin_dirs: str | Sequence[str], *, timeout: float) -> None:
        self.bin_dirs = split_path_list(bin_dirs)
        self.timeout = timeout

    def find_plugin(self, kind: str) -> str:
        if "/" in kind:
            raise CniError(f"invalid CNI plugin type {kind!r}", plugin=kind)
        for directory in self.bin_dirs:
            candidate = os.path.join(directory, kind)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        raise CniError(
            f"CNI plugin {kind!r} not found in {':'.join(self.bin_dirs) or '(no directory)'}",
            plugin=kind,
        )

    def _exec(
        self,
        command: str,
        plugin: Mapping[str, Any],
        stdin: Mapping[str, Any],
        env: Mapping[str, str],
        budget: Deadline,
    ) -> dict[str, Any] | None:
        kind = str(plugin["type"])
        binary = self.find_plugin(kind)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        environ.update(env)
        environ["CNI_COMMAND"] = command
        environ["CNI_PATH"] = ":".join(self.bin_dirs)
        timeout = budget.remaining(f"{kind} {command}")
        try:
            proc = subprocess.run(
                [binary],
                input=json.dumps(stdin).encode(),
                env=environ,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise CniTimeout(
                f"CNI plugin {kind} {command} did not finish within {timeout:.1f}s",
                plugin=kind,
                command=command,
            ) from None
        except OSError as exc:
            raise CniError(f"CNI plugin {kind} {command}: {exc}", plugin=kind) from None
        if proc.returncode != 0:
            raise parse_error(
                proc.stdout, proc.stderr, proc.returncode, plugin=kind, command=command
            )
        if command != "ADD":
            return None
        try:
            result = json.loads(proc.stdout)
        except json.JSONDecodeError as exc:
            raise CniError(
                f"CNI plugin {kind} ADD printed no JSON result: {exc}", plugin=kind, command="ADD"
            ) from None
        if not isinstance(result, dict):
            raise CniError(f"CNI plugin {kind} ADD result is not an object", plugin=kind)
        return result

    @staticmethod
    def _env(container_id: str, netns: str, ifname: str, args: str) -> dict[str, str]:
        return {
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_ARGS": args,
        }

    def add(
        self,
        config: NetworkConfigList,
        *,
        container_id: str,
        netns: str,
        ifname: str = DEFAULT_IFNAME,
        args: str = "",
    ) -> CniResult:
        """ADD through the chain in order, each plugin getting the previous result."""
        budget = Deadline(
            self.timeout, what=f"CNI ADD {config.name} for {container_id}", expired=CniTimeout
        )
        env = self._env(container_id, netns, ifname, args)
        result: dict[str, Any] | None = None
        for plugin in config.plugins:
            result = self._exec("ADD", plugin, plugin_stdin(config, plugin, result), env, budget)
        return parse_result(result or {})

    def delete(
        self,
        config: NetworkConfigList,
        *,
        container_id: str,
        netns: str,
        ifname: str = DEFAULT_IFNAME,
        args: str = "",
        prev_result: Mapping[str, Any] | None = None,
    ) -> None:
        """DEL through the chain in reverse; every plugin runs even after a failure,
        and the first failure is raised at the end."""
        budget = Deadline(
            self.timeout, what=f"CNI DEL {config.name} for {container_id}", expired=CniTimeout
        )
        env = self._env(container_id, netns, ifname, args)
        first: CniError | None = None
        for plugin in reversed(config.plugins):
            try:
                self._exec("DEL", plugin, plugin_stdin(config, plugin, prev_result), env, budget)
            except CniError as exc:
                log.warning("CNI DEL %s for %s: %s", config.name, container_id, exc)
                first = first or exc
        if first is not None:
            raise first
