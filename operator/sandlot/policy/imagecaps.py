"""How much of an image's data the agent reads, at most: every read of registry or
content-store data is streamed and stops at its cap, so a hostile image (a 100 MiB
manifest, a 1 GiB config, a gzip bomb under a named ``USER``) costs the agent a
bounded amount of memory and time and fails its sandbox naming the cap, instead
of growing the agent past its own memory limit.
"""

from __future__ import annotations

MAX_MANIFEST_BYTES = 4 * 2**20
"""A manifest or index larger than this is refused (containerd's own cap)."""
MAX_CONFIG_BYTES = 8 * 2**20
"""An image config larger than this is refused, whatever its descriptor says (a
config is a few KiB; its history makes it grow, not to megabytes)."""
MAX_USER_LOOKUP_BYTES = 512 * 2**20
"""Bytes of layer content (decompressed) read looking for ``/etc/passwd`` and
``/etc/group`` to resolve a ``USER`` given by name; the lookup reads layers top
down and stops at the files, so only images that bury them under this much
content fail."""


def mib(count: int) -> str:
    """``count`` bytes for a message naming a cap: in MiB when whole ones."""
    return f"{count >> 20} MiB" if count and count % 2**20 == 0 else f"{count} bytes"


__all__ = ["MAX_CONFIG_BYTES", "MAX_MANIFEST_BYTES", "MAX_USER_LOOKUP_BYTES", "mib"]
