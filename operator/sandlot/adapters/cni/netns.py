"""Named network namespaces (``/run/netns/sandlot-<container>``, made with
iproute2's ``ip netns``): they exist before the task starts, so the address is known
before the sandbox runs, and runc joins one by path. They are visible to ``ip
netns`` on the node and removed on every teardown."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from sandlot.adapters.cni.errors import CniError, CniTimeout

NETNS_DIR = "/run/netns"
NETNS_PREFIX = "sandlot-"


def join_netns(oci_spec: dict[str, Any], netns_path: str) -> dict[str, Any]:
    """Point the OCI spec's network namespace at ``netns_path`` (runc joins it instead
    of making a new one); a spec without one (host network) is left alone."""
    for ns in oci_spec.get("linux", {}).get("namespaces", []):
        if ns.get("type") == "network":
            ns["path"] = netns_path
    return oci_spec


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
