"""Sandbox networking through CNI: the node's network plugins give each sandbox its
own network namespace and address, exactly as they do for the kubelet's pods.

This module is a small CNI runtime, following the CNI specification (1.0.0, and
the 0.3.x/0.4.0 result formats the plugins may answer in): it loads the node's
network configuration the way the kubelet and containerd do (the first
``*.conflist``, ``*.conf`` or ``*.json`` file of the configuration directory in
lexical order), and runs the configuration's plugin chain with the protocol's
environment (``CNI_COMMAND``, ``CNI_CONTAINERID``, ``CNI_NETNS``, ``CNI_IFNAME``,
``CNI_PATH``, ``CNI_ARGS``) and stdin (the plugin's config with the list's
``name`` and ``cniVersion``, and ``prevResult`` chained from plugin to plugin).
No bridge, veth or address is made here: the plugins do that work.

Trade-offs, all in favour of never leaking or hanging:

- **Bounded**: one CNI operation (ADD or DEL of a whole chain) has one time
  budget (``adapters.deadline``); every plugin run gets what is left of it as a
  subprocess timeout, so a plugin that hangs costs at most the budget, never the
  agent.
- **No CHECK**: CHECK needs the ADD result as ``prevResult``, which nothing keeps
  across an agent restart (the labels hold only what DEL needs), and a re-adopted
  sandbox is never torn down for a failed check anyway; a plugin that lost a
  sandbox's interface shows up in the sandbox itself, not here.
- **DEL is tolerant**: it runs every plugin of the chain in reverse order even when
  one fails (so the IPAM plugin still releases the address when, say, a port-map
  plugin errs), then reports the first failure. It needs no cached ADD result:
  what it needs (namespace path, interface, network name) is recorded in the
  container's labels at create time (``Attachment.labels``), so an agent that
  crashed can still release a sandbox's address when its sweep removes it.
- **Named network namespaces** (``/run/netns/sandlot-<container>``, made with
  iproute2's ``ip netns``) exist before the task starts, so the address is known
  before the sandbox runs; runc joins the namespace by path. They are visible to
  ``ip netns`` on the node and removed on every teardown.

Parsing (configuration choice, results, errors) is pure and tested with plain
data; everything that runs a process is in the small ``CniRunner``/``Netns`` part.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandlot.adapters.deadline import Deadline
from sandlot.api.keys import IFNAME_LABEL, NETNS_LABEL, NETWORK_LABEL

log = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".conflist", ".conf", ".json")
NETNS_DIR = "/run/netns"
NETNS_PREFIX = "sandlot-"
DEFAULT_IFNAME = "eth0"


# Well-known CNI error codes (spec, "Error"); 100+ are plugin-specific.
ERROR_CODES = {
    1: "incompatible CNI version",
    2: "unsupported field in network configuration",
    3: "container unknown or does not exist",
    4: "invalid necessary environment variables",
    5: "I/O failure",
    6: "failed to decode content",
    7: "invalid network config",
    11: "try again later",
}


class CniError(Exception):
    """A CNI operation failed; ``code``, ``msg`` and ``details`` are the plugin's error."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 0,
        msg: str = "",
        details: str = "",
        plugin: str = "",
        command: str = "",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.msg = msg or message
        self.details = details
        self.plugin = plugin
        self.command = command


class CniTimeout(CniError):
    """A plugin (or ``ip``) did not finish within the operation's budget."""


class NoNetworkConfig(CniError):
    """The configuration directory holds no usable network configuration."""


# ------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class NetworkConfigList:
    """A network configuration list (a single ``.conf`` becomes a list of one)."""

    name: str
    cni_version: str
    plugins: tuple[Mapping[str, Any], ...]
    source: str = ""
    disable_check: bool = False


def select_config_file(names: Iterable[str]) -> str | None:
    """The file libcni's ``ConfFiles`` + sort would pick: the lexically first with a
    CNI configuration suffix (hidden files are skipped, as editors leave them)."""
    candidates = sorted(n for n in names if n.endswith(CONFIG_SUFFIXES) and not n.startswith("."))
    return candidates[0] if candidates else None


def parse_config(text: str, source: str = "") -> NetworkConfigList:
    """A ``.conflist`` (``plugins``) or a single-plugin ``.conf`` (``type``)."""
    where = source or "network configuration"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NoNetworkConfig(f"{where}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise NoNetworkConfig(f"{where}: not a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise NoNetworkConfig(f"{where}: no network name")
    version = str(data.get("cniVersion") or "0.2.0")
    if "plugins" in data:
        plugins = data["plugins"]
        if not isinstance(plugins, list) or not plugins:
            raise NoNetworkConfig(f"{where}: 'plugins' must be a non-empty list")
    elif "type" in data:
        plugins = [{k: v for k, v in data.items() if k not in ("name", "cniVersion")}]
    else:
        raise NoNetworkConfig(f"{where}: neither 'plugins' nor 'type'")
    for i, plugin in enumerate(plugins):
        if not isinstance(plugin, dict) or not isinstance(plugin.get("type"), str):
            raise NoNetworkConfig(f"{where}: plugin {i} has no 'type'")
    return NetworkConfigList(
        name=name,
        cni_version=version,
        plugins=tuple(plugins),
        source=source,
        disable_check=bool(data.get("disableCheck")),
    )


def load_config(conf_dir: str | Path, name: str | None = None) -> NetworkConfigList:
    """The node's network: the first configuration file of ``conf_dir`` or, with
    ``name``, the configuration of that network name (for DEL of an older attach)."""
    directory = Path(conf_dir)
    try:
        names = sorted(p.name for p in directory.iterdir() if p.is_file())
    except OSError as exc:
        raise NoNetworkConfig(f"no CNI network configuration in {directory}: {exc}") from None
    if name is None:
        chosen = select_config_file(names)
        if chosen is None:
            raise NoNetworkConfig(f"no CNI network configuration in {directory}")
        path = directory / chosen
        return parse_config(path.read_text(), str(path))
    for candidate in names:
        if not candidate.endswith(CONFIG_SUFFIXES) or candidate.startswith("."):
            continue
        path = directory / candidate
        try:
            config = parse_config(path.read_text(), str(path))
        except (CniError, OSError):
            continue
        if config.name == name:
            return config
    raise NoNetworkConfig(f"no CNI network named {name!r} in {directory}")


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


# ------------------------------------------------------------------ results and errors


@dataclass(frozen=True)
class IpConfig:
    address: str  # CIDR, "10.77.0.2/24"
    gateway: str = ""
    interface: int | None = None

    @property
    def ip(self) -> str:
        return self.address.split("/", 1)[0]

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


def parse_error(
    stdout: bytes | str, stderr: bytes | str, returncode: int, *, plugin: str, command: str
) -> CniError:
    """A failed plugin run as a ``CniError``: the spec's error JSON on stdout when the
    plugin wrote one (``code``, ``msg``, ``details``), else its stderr."""
    out = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    err = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    code, msg, details = 0, "", ""
    try:
        data = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        data = None
    if isinstance(data, Mapping) and ("code" in data or "msg" in data):
        raw_code = data.get("code")
        code = raw_code if isinstance(raw_code, int) else 0
        msg = str(data.get("msg") or "")
        details = str(data.get("details") or "")
    if not msg:
        msg = (err.strip() or out.strip() or f"exit status {returncode}").splitlines()[-1]
    text = f"CNI plugin {plugin} {command} failed: {msg}"
    if details:
        text += f" ({details})"
    if code:
        text += f" [code {code}: {ERROR_CODES.get(code, 'plugin-specific')}]"
    return CniError(text, code=code, msg=msg, details=details, plugin=plugin, command=command)


def cni_args(pairs: Mapping[str, str]) -> str:
    """``CNI_ARGS``: ``IgnoreUnknown=1`` first, so plugins that know none of the keys
    (the Kubernetes ones the kubelet also passes) accept them."""
    return ";".join(["IgnoreUnknown=1", *(f"{k}={v}" for k, v in pairs.items())])


def join_netns(oci_spec: dict[str, Any], netns_path: str) -> dict[str, Any]:
    """Point the OCI spec's network namespace at ``netns_path`` (runc joins it instead
    of making a new one); a spec without one (host network) is left alone."""
    for ns in oci_spec.get("linux", {}).get("namespaces", []):
        if ns.get("type") == "network":
            ns["path"] = netns_path
    return oci_spec


# ------------------------------------------------------------------ running plugins


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


# ------------------------------------------------------------------ network namespaces


class Netns:
    """Named network namespaces through iproute2 (``ip netns``), under ``/run/netns``."""

    def __init__(self, *, timeout: float, ip_binary: str = "ip") -> None:
        self.timeout = timeout
        self.ip = ip_binary

    @staticmethod
    def name_for(container_id: str) -> str:
        return f"{NETNS_PREFIX}{container_id}"

    @staticmethod
    def path_of(name: str) -> str:
        return f"{NETNS_DIR}/{name}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(
                [self.ip, *args], capture_output=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise CniTimeout(
                f"ip {' '.join(args)} did not finish within {self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise CniError(f"ip {' '.join(args)}: {exc}") from None

    def create(self, name: str) -> str:
        """A fresh namespace with its loopback up; a leftover of the same name is
        replaced (an old interface in it would make ADD fail)."""
        path = self.path_of(name)
        if os.path.exists(path):
            self.delete(name)
        for args in (("netns", "add", name), ("-n", name, "link", "set", "lo", "up")):
            proc = self._run(*args)
            if proc.returncode != 0:
                if args[1] != "add":
                    self.delete(name)
                raise CniError(
                    f"ip {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}"
                )
        return path

    def delete(self, name: str) -> None:
        """Unmount and remove; a namespace already gone is success."""
        if not os.path.lexists(self.path_of(name)):
            return
        proc = self._run("netns", "delete", name)
        if proc.returncode != 0 and os.path.lexists(self.path_of(name)):
            raise CniError(
                f"ip netns delete {name}: {proc.stderr.decode(errors='replace').strip()}"
            )

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(NETNS_DIR))
        except OSError:
            return []


# ------------------------------------------------------------------ a sandbox's attachment


@dataclass(frozen=True)
class Attachment:
    """Everything DEL needs, recorded on the container so no agent memory is needed."""

    container_id: str
    network: str
    netns_path: str
    ifname: str = DEFAULT_IFNAME

    @property
    def netns_name(self) -> str:
        return os.path.basename(self.netns_path)

    def labels(self) -> dict[str, str]:
        return {
            NETNS_LABEL: self.netns_path,
            NETWORK_LABEL: self.network,
            IFNAME_LABEL: self.ifname,
        }

    @classmethod
    def from_labels(cls, container_id: str, labels: Mapping[str, str]) -> Attachment | None:
        """None for a container that was never attached (host network, or CNI off)."""
        path = labels.get(NETNS_LABEL)
        if not path:
            return None
        return cls(
            container_id,
            labels.get(NETWORK_LABEL, ""),
            path,
            labels.get(IFNAME_LABEL) or DEFAULT_IFNAME,
        )


class SandboxNetwork:
    """The agent's use of CNI: plan an attachment (before the container is created, so
    its labels record it), attach (namespace + ADD, before the task starts), detach
    (DEL + namespace removal, on every teardown)."""

    def __init__(
        self,
        conf_dir: str,
        bin_dirs: str | Sequence[str],
        *,
        timeout: float,
        ifname: str = DEFAULT_IFNAME,
    ) -> None:
        self.conf_dir = conf_dir
        self.runner = CniRunner(bin_dirs, timeout=timeout)
        self.netns = Netns(timeout=timeout)
        self.ifname = ifname
        self.timeout = timeout
        # ADDs run one at a time: plugins that create shared state on first use race
        # otherwise (the bridge plugin of containernetworking-plugins 1.1 fails with
        # "could not set bridge's mac: invalid argument" when concurrent ADDs create
        # the bridge). An ADD takes ~15 ms; waiting for the lock is bounded too.
        self._add_lock = threading.Lock()

    @property
    def bound(self) -> float:
        """Seconds one detach can take at most: the DEL budget and two ``ip`` calls."""
        return 3 * self.timeout

    def plan(self, container_id: str) -> Attachment:
        config = load_config(self.conf_dir)
        return Attachment(
            container_id, config.name, Netns.path_of(Netns.name_for(container_id)), self.ifname
        )

    def attach(self, attachment: Attachment, args: Mapping[str, str]) -> CniResult:
        """Create the namespace and ADD; on failure nothing is undone here: the caller
        tears the container down, which detaches (DEL is safe after a partial ADD)."""
        config = load_config(self.conf_dir, attachment.network)
        self.netns.create(attachment.netns_name)
        if not self._add_lock.acquire(timeout=self.timeout):
            raise CniTimeout(
                f"CNI ADD of {attachment.container_id}: other ADDs held the network for "
                f"over {self.timeout:g}s"
            )
        try:
            result = self._add_with_one_retry(config, attachment, cni_args(args))
        finally:
            self._add_lock.release()
        if result.primary_ip(attachment.ifname) is None:
            raise CniError(f"CNI network {config.name} gave {attachment.container_id} no address")
        return result

    def _add_with_one_retry(
        self, config: NetworkConfigList, attachment: Attachment, args: str
    ) -> CniResult:
        """ADD; after a plugin error, DEL what it left and ADD once more.

        The first ADD on a node creates the bridge, and the bridge plugin of
        containernetworking-plugins 1.1 can then fail with "could not set bridge's
        mac: invalid argument" (a new bridge has no address until a port joins); the
        same ADD succeeds once the bridge exists. A timeout is not retried: the
        budget is spent."""

        def add() -> CniResult:
            return self.runner.add(
                config,
                container_id=attachment.container_id,
                netns=attachment.netns_path,
                ifname=attachment.ifname,
                args=args,
            )

        try:
            return add()
        except CniTimeout:
            raise
        except CniError as first:
            log.warning(
                "container %s: CNI ADD failed (%s); cleaning up and trying once more",
                attachment.container_id,
                first,
            )
            try:
                self.runner.delete(
                    config,
                    container_id=attachment.container_id,
                    netns=attachment.netns_path,
                    ifname=attachment.ifname,
                    args=args,
                )
            except CniError as cleanup:
                log.warning(
                    "container %s: DEL before the retry failed: %s",
                    attachment.container_id,
                    cleanup,
                )
            return add()

    def detach(self, attachment: Attachment, args: Mapping[str, str] | None = None) -> None:
        """DEL (with the namespace when it still exists, without when it is gone, as
        the spec allows) and remove the namespace. A network whose configuration was
        removed from the node cannot be DELeted: that is logged and the namespace
        still removed. Other failures raise, and the caller keeps the container for
        a later retry."""
        netns = attachment.netns_path if os.path.exists(attachment.netns_path) else ""
        try:
            config = load_config(self.conf_dir, attachment.network or None)
        except NoNetworkConfig as exc:
            log.warning(
                "container %s: cannot DEL from network %r: %s",
                attachment.container_id,
                attachment.network,
                exc,
            )
        else:
            self.runner.delete(
                config,
                container_id=attachment.container_id,
                netns=netns,
                ifname=attachment.ifname,
                args=cni_args(args or {}),
            )
        self.netns.delete(attachment.netns_name)


__all__ = [
    "Attachment",
    "CniError",
    "CniResult",
    "CniRunner",
    "CniTimeout",
    "IpConfig",
    "Netns",
    "NetworkConfigList",
    "NoNetworkConfig",
    "SandboxNetwork",
    "cni_args",
    "join_netns",
    "load_config",
    "parse_config",
    "parse_error",
    "parse_result",
    "select_config_file",
]
