"""An address for local agents' stream servers that the API server will proxy to.

The API server proxies only to a pod IP that is global unicast (never loopback
or link-local), and the local agents are plain processes on this host. So the
dev tooling adds an interface of its own (a bridge without ports) with one private address
(10.239.0.0/16, chosen at random so that concurrent runs do not meet), binds
the agents' stream servers to it, and records a stand-in Pod per agent with
that IP (``adapters.agentpods``). Nothing outside this host can reach it.
Needs root (``ip link``).
"""

from __future__ import annotations

import os
import subprocess
import uuid


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class StreamAddress:
    """An interface (a bridge without ports) with one private address; ``create()``, then
    ``remove()``."""

    def __init__(self) -> None:
        token = uuid.uuid4().bytes
        self.link = f"slst{token.hex()[:8]}"
        self.ip = f"10.239.{token[4]}.{1 + token[5] % 254}"

    def create(self) -> StreamAddress:
        _ip("link", "add", self.link, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.ip}/32", "dev", self.link)
            _ip("link", "set", self.link, "up")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        subprocess.run(
            ["ip", "link", "del", self.link], capture_output=True, timeout=30, check=False
        )

    def __enter__(self) -> StreamAddress:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def can_create() -> bool:
    return os.geteuid() == 0


__all__ = ["StreamAddress", "can_create"]
