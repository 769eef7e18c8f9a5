"""Where a registry is reached from this node: containerd's ``hosts.toml`` conventions.

A node-level directory (the agent's ``registryConfigDir``, like containerd's
``config_path``, often ``/etc/containerd/certs.d``) holds one directory per
registry host (``docker.io``, ``registry.example:5000``, or ``_default``) with a
``hosts.toml``::

    server = "https://registry.example:5000"   # the registry itself (optional)
    ca = "/etc/certs/private-ca.pem"           # a private CA for it

    [host."https://mirror.internal"]           # tried first, in file order
      capabilities = ["pull", "resolve"]
      ca = "/etc/certs/mirror-ca.pem"
      skip_verify = false

    [host."http://plain.internal:5000"]        # plain HTTP: the scheme says so
      capabilities = ["pull", "resolve"]

Hosts without ``resolve`` and ``pull`` are skipped (they cannot serve a pull by
tag). Without any file, ``docker.io`` is ``https://registry-1.docker.io``, other
registries are ``https://<host>``, and a loopback registry (``localhost``,
``127.0.0.1``) is plain HTTP, as containerd and Docker allow; it is reached at all
only when the agent's ``registry_private_hosts`` lists it (``policy.pulling.access``).
"""

from __future__ import annotations

import ipaddress
import itertools
import tomllib
from pathlib import Path
from typing import Any

from sandlot.adapters.pulling.registry import Endpoint
from sandlot.policy.pulling import ImageReference

NEEDED_CAPABILITIES = frozenset({"pull", "resolve"})


class HostsConfigError(ValueError):
    """A hosts.toml that cannot be read; the message names the file."""


def _default_server(ref: ImageReference) -> str:
    scheme = "http" if ref.loopback else "https"
    return f"{scheme}://{ref.api_host}"


def _ca(value: Any, path: Path) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):  # containerd accepts a list; the first CA bundle serves
        value = value[0] if value else None
    if value is not None and not isinstance(value, str):
        raise HostsConfigError(f"{path}: ca must be a path or a list of paths")
    return value


def _load(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HostsConfigError(f"{path}: {exc}") from exc


def node_addresses() -> frozenset[str]:
    """This host's own interface addresses (IPv4 from ``/proc/net/fib_trie``'s local
    entries, IPv6 from ``/proc/net/if_inet6``); what cannot be read is left out."""
    found: set[str] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for before, line in itertools.pairwise(lines):
        if "/32 host LOCAL" in line and "|--" in before:
            found.add(before.split("|--", 1)[1].strip())
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)


def endpoints_for(ref: ImageReference, config_dir: str | None) -> list[Endpoint]:
    """The endpoints to try for ``ref``, mirrors first and the registry itself last."""
    default = Endpoint(_default_server(ref))
    if not config_dir:
        return [default]
    base = Path(config_dir)
    path = base / ref.registry / "hosts.toml"
    if not path.is_file():
        path = base / "_default" / "hosts.toml"
        if not path.is_file():
            return [default]
    doc = _load(path)
    endpoints: list[Endpoint] = []
    for url, host in (doc.get("host") or {}).items():
        if not isinstance(host, dict):
            raise HostsConfigError(f"{path}: [host.{url!r}] must be a table")
        capabilities = set(host.get("capabilities") or NEEDED_CAPABILITIES)
        if not capabilities >= NEEDED_CAPABILITIES:
            continue
        endpoints.append(
            Endpoint(
                url=str(url).rstrip("/"),
                ca_file=_ca(host.get("ca"), path),
                skip_verify=bool(host.get("skip_verify", False)),
                override_path=bool(host.get("override_path", False)),
            )
        )
    server = str(doc.get("server") or default.url).rstrip("/")
    endpoints.append(
        Endpoint(
            url=server,
            ca_file=_ca(doc.get("ca"), path),
            skip_verify=bool(doc.get("skip_verify", False)),
        )
    )
    return endpoints


__all__ = ["HostsConfigError", "endpoints_for", "node_addresses"]
