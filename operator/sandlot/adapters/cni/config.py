"""The node's network configuration, loaded the way the kubelet and containerd do
(the first ``*.conflist``, ``*.conf`` or ``*.json`` file of the configuration
directory in lexical order). Parsing is pure and tested with plain data; only
``load_config`` reads the directory."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.adapters.cni.errors import CniError, NoNetworkConfig

CONFIG_SUFFIXES = (".conflist", ".conf", ".json")


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
