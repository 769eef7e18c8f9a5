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

The package is split by job: ``config`` (loading the node's configuration),
``plugins`` (running the chain, reading results), ``errors`` (what a failure
says), ``netns`` (named namespaces) and ``attachment`` (a sandbox's attach and
detach). Callers import from the package.
"""

from __future__ import annotations

from sandlot.adapters.cni.attachment import LOOPBACK_ONLY, Attachment, SandboxNetwork
from sandlot.adapters.cni.config import (
    CONFIG_SUFFIXES,
    NetworkConfigList,
    load_config,
    parse_config,
    select_config_file,
)
from sandlot.adapters.cni.errors import (
    ERROR_CODES,
    CniError,
    CniTimeout,
    NoNetworkConfig,
    parse_error,
)
from sandlot.adapters.cni.netns import NETNS_DIR, NETNS_PREFIX, Netns, join_netns
from sandlot.adapters.cni.plugins import (
    DEFAULT_IFNAME,
    CniResult,
    CniRunner,
    IpConfig,
    cni_args,
    parse_result,
    plugin_stdin,
    split_path_list,
)

__all__ = [
    "CONFIG_SUFFIXES",
    "DEFAULT_IFNAME",
    "ERROR_CODES",
    "LOOPBACK_ONLY",
    "NETNS_DIR",
    "NETNS_PREFIX",
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
    "plugin_stdin",
    "select_config_file",
    "split_path_list",
]
